"""Running the recorder: rotation and part numbering, oversized bodies, a dead upstream, where it may listen."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import os
import signal
import socket
import time
from pathlib import Path

import aiohttp
import pytest

from harness.cli import app
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
    absolute = [
        dt.datetime.fromisoformat(t.metadata["clock"]) + dt.timedelta(seconds=a)
        for t in traces
        for a in t.table.column("arrival_s").to_pylist()
    ]
    assert absolute == sorted(absolute)  # parts line up on the wall clock: absolute = clock + arrival_s
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(absolute)]
    assert all(0.2 < gap < 1.5 for gap in gaps), gaps  # requests were sent 0.25 s apart
    assert all(t.table.column("arrival_s")[0].as_py() == 0.0 for t in traces)  # each part replays at once
    assert len({t.metadata["replaybench.record.started_at"] for t in traces}) == 1
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
    refused = run_cli(
        "record", "--upstream", "http://127.0.0.1:9", "--listen", "0.0.0.0:0", "-o", str(tmp_path / "t.parquet")
    )
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("error: --listen 0.0.0.0")
    assert "--allow-remote" in refused.stderr and not list(tmp_path.iterdir())
    with recorder(
        "http://127.0.0.1:9", tmp_path / "t.parquet", "--allow-remote", logs=tmp_path, listen="0.0.0.0:0"
    ) as rec:
        assert rec.url.startswith("http://0.0.0.0:")
        assert rec.stop() == 0


def _cli_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run the CLI in-process on arguments that must be refused: exit code 2 and exactly one stderr line."""
    with pytest.raises(SystemExit) as exit_info:
        app(args=["record", *args], prog_name="replaybench")
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    return stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--upstream", "ftp://x"], "not an http(s) URL"),
        (["--redact", "maybe"], "--redact"),
        (["--rotate", "soon"], "--rotate"),
        (["--session-header", "Cookie"], "credentials"),
        (["--max-body", "huge"], "--max-body"),
        (["--listen", "10.1.2.3:80"], "--allow-remote"),
    ],
)
def test_usage_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], needle: str
) -> None:
    assert needle in _cli_error(capsys, "--upstream", "http://127.0.0.1:9", "-o", str(tmp_path / "t.parquet"), *args)
    assert not list(tmp_path.iterdir())


def test_missing_options_and_recover_dir_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert "-o OUT" in _cli_error(capsys, "--upstream", "http://127.0.0.1:9")
    assert "not a directory" in _cli_error(capsys, "--recover", str(tmp_path / "nope"))


def test_empty_recording_writes_no_part(tmp_path: Path) -> None:
    with recorder("http://127.0.0.1:9", tmp_path / "t.parquet", logs=tmp_path / "logs") as rec:
        assert rec.stop() == 0
    assert not list(tmp_path.glob("t-*")) and "0 rows in 0 part(s)" in rec.stdout.read_text()


def test_shutdown_waits_for_drain_then_counts_unfinished(tmp_path: Path) -> None:
    """A stream that never ends cannot hold shutdown hostage: after --drain it is cut and counted."""
    body = encode(completion_body("stuck", 10, stream=True, ignore_eos=True))
    with (
        upstream(mode="stall", fault_after=2) as base,
        recorder(base, tmp_path / "t.parquet", "--drain", "0.5s", logs=tmp_path) as rec,
    ):

        async def stalled_then_stop() -> bytes:
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{rec.url}/v1/completions", data=body) as response,
            ):
                first = await response.content.readany()  # the stream has started
                os.killpg(rec.proc.pid, signal.SIGTERM)
                with contextlib.suppress(aiohttp.ClientError):
                    await response.read()
                return first

        assert b'"text": " t0"' in asyncio.run(stalled_then_stop())
        assert rec.proc.wait(timeout=60) == 0
    assert "unfinished at shutdown: 1" in rec.stdout.read_text()
    assert not list(tmp_path.glob("t-*"))  # nothing else was recorded, so no part


def test_upstream_dropping_mid_stream_drops_the_client_too(tmp_path: Path) -> None:
    body = encode(completion_body("dropped", 10, stream=True, ignore_eos=True))

    async def read_until_broken(url: str) -> tuple[bytes, bool]:
        received = b""
        async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/completions", data=body) as response:
            try:
                async for chunk in response.content.iter_any():
                    received += chunk
            except aiohttp.ClientError:
                return received, True
        return received, False

    # 50 ms between tokens: each chunk reaches the recorder in a read of its own, so the ones after the first token
    # are held for the end of the stream, which here never comes cleanly (they were lost that way under load)
    dropping = upstream(mode="drop", fault_after=3, token_delay=0.05)
    with dropping as base, recorder(base, tmp_path / "t.parquet", logs=tmp_path) as rec:
        direct = asyncio.run(read_until_broken(base))
        proxied = asyncio.run(read_until_broken(rec.url))
        assert rec.stop() == 0
    assert proxied[1] and direct[1]  # both clients see a broken stream, not a clean end
    assert without_created(proxied[0]) == without_created(direct[0]) and b'" t2"' in proxied[0]
    row = Trace.read(tmp_path / "t-0001.parquet").table.to_pylist()[0]
    assert (row["status"], row["finish_reason"], row["prompt_tokens"]) == (200, None, 0)  # 0: no usage came
    assert row["output_tokens"] == 3  # no usage arrived: the streamed token chunks are counted
    assert "upstream failures: 1" in rec.stdout.read_text()
