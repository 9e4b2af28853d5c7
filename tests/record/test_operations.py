"""Running the recorder: rotation and part numbering, oversized bodies, a dead upstream, where it may listen."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from harness.trace.model import Trace
from tests.record.recorder_process import recorder, run_cli
from tests.record.traffic import completion_body, encode, fetch_all, without_created
from tests.support.openai_server import upstream


def test_rotation_writes_numbered_parts_and_never_overwrites(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "prod-0001.parquet").write_bytes(b"an earlier recording")
    with upstream() as base, recorder(base, out / "prod.parquet", "--rotate", "1s", logs=tmp_path) as rec:
        for i in range(10):
            fetch_all([("POST", "/v1/completions", encode(completion_body(f"p{i}", 1)))], rec.url)
            time.sleep(0.25)
        assert rec.stop() == 0
    assert (out / "prod-0001.parquet").read_bytes() == b"an earlier recording"
    parts = sorted(out.glob("prod-*.parquet"))[1:]
    assert len(parts) >= 2 and parts[0].name == "prod-0002.parquet" and not list(out.glob("*.segment.jsonl"))
    traces = [Trace.read(p) for p in parts]
    prompts = [p for t in traces for p in t.table.column("prompt").to_pylist()]
    assert prompts == [f"p{i}" for i in range(10)]
    arrivals = [a for t in traces for a in t.table.column("arrival_s").to_pylist()]
    assert arrivals == sorted(arrivals)  # one clock (the recorder's start) across parts
    assert len({t.metadata["clock"] for t in traces}) == 1
    assert [t.metadata["replaybench.record.part"] for t in traces] == [str(i + 2) for i in range(len(parts))]


def test_body_over_max_body_is_forwarded_not_recorded(tmp_path: Path) -> None:
    big = encode(completion_body("big " * 1000, 2))
    small = encode(completion_body("small", 2))
    requests = [("POST", "/v1/completions", big), ("POST", "/v1/completions", small)]
    with upstream() as base, recorder(base, tmp_path / "t.parquet", "--max-body", "1KiB", logs=tmp_path) as rec:
        direct, proxied = fetch_all(requests, base), fetch_all(requests, rec.url)
        assert rec.stop() == 0
    assert [without_created(r.body) for r in proxied] == [without_created(r.body) for r in direct]
    assert b'"prompt_tokens": 1000' in proxied[0].body
    assert Trace.read(tmp_path / "t-0001.parquet").table.column("prompt").to_pylist() == ["small"]
    assert "bodies over --max-body: 1" in rec.stdout.read_text()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_dead_upstream_gives_502_and_is_recorded(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{_closed_port()}"
    with recorder(dead, tmp_path / "t.parquet", logs=tmp_path) as rec:
        [answer] = fetch_all([("POST", "/v1/completions", encode(completion_body("x", 2)))], rec.url)
        os.killpg(rec.proc.pid, signal.SIGINT)  # Ctrl-C is as graceful as SIGTERM
        assert rec.proc.wait(timeout=60) == 0
    assert answer.status == 502 and b"upstream unreachable" in answer.body
    row = Trace.read(tmp_path / "t-0001.parquet").table.to_pylist()[0]
    assert (row["status"], row["output_tokens"]) == (502, 0)
    assert "upstream failures: 1" in rec.stdout.read_text()


def test_non_loopback_listen_needs_allow_remote(tmp_path: Path) -> None:
    refused = run_cli("record", "--upstream", "http://127.0.0.1:9", "--listen", "0.0.0.0:0",
                      "-o", str(tmp_path / "t.parquet"))
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("error: --listen 0.0.0.0")
    assert "--allow-remote" in refused.stderr and not list(tmp_path.iterdir())
    with recorder("http://127.0.0.1:9", tmp_path / "t.parquet", "--allow-remote", logs=tmp_path,
                  listen="0.0.0.0:0") as rec:
        assert rec.url.startswith("http://0.0.0.0:")
        assert rec.stop() == 0


def test_usage_errors_are_one_line(tmp_path: Path) -> None:
    for args, needle in [(["--upstream", "ftp://x"], "not an http(s) URL"), (["--redact", "maybe"], "--redact"),
                         (["--rotate", "soon"], "--rotate"), (["--session-header", "Cookie"], "credentials")]:
        base = ["--upstream", "http://127.0.0.1:9", "-o", str(tmp_path / "t.parquet")]
        result = run_cli("record", *base, *args)
        assert result.returncode == 2 and result.stderr.count("\n") == 1 and needle in result.stderr, result.stderr
    missing = run_cli("record", "--upstream", "http://127.0.0.1:9")
    assert missing.returncode == 2 and "-o OUT" in missing.stderr


def test_recover_of_a_missing_directory_is_a_user_error(tmp_path: Path) -> None:
    result = run_cli("record", "--recover", str(tmp_path / "nope"))
    assert result.returncode == 2 and "not a directory" in result.stderr


def test_empty_recording_writes_no_part(tmp_path: Path) -> None:
    with recorder("http://127.0.0.1:9", tmp_path / "t.parquet", logs=tmp_path / "logs") as rec:
        assert rec.stop() == 0
    assert not list(tmp_path.glob("t-*")) and "0 rows in 0 part(s)" in rec.stdout.read_text()
