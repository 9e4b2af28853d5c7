"""`replaybench replay` from the command line: summary on success, one error line on bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.records.result_io import read_results
from tests.replay.support import cli, free_port_without_listener, make_trace


def test_replay_writes_results_and_prints_a_summary(ok_url: str, tmp_path: Path) -> None:
    trace = make_trace(n=20, gap_s=0.01).write(tmp_path / "t.parquet")
    done = cli(
        "replay",
        trace,
        "--url",
        ok_url + "/v1",
        "-o",
        tmp_path / "r.parquet",
        "--limit",
        "8",
        "--time-scale",
        "0.5",
        "--arm",
        "base",
        "--repeat",
        "2",
    )
    assert done.returncode == 0, done.stderr
    assert "requests: 8 finished of 8 scheduled; errors: none" in done.stdout
    for label in ("send lag: p50", "rate: achieved", "TTFT", "ITL", "TPOT", "E2E"):
        assert label in done.stdout
    table, meta = read_results(tmp_path / "r.parquet")
    assert table.num_rows == 8 and meta["replaybench.arm"] == "base" and meta["replaybench.repeat"] == "2"
    assert table.column("intended_s").to_pylist()[-1] == pytest.approx(7 * 0.01 * 0.5)
    assert meta["replaybench.url"] == ok_url  # the /v1 suffix is dropped


def test_unreachable_server_is_one_line_exit_2(tmp_path: Path) -> None:
    trace = make_trace(n=2).write(tmp_path / "t.parquet")
    done = cli("replay", trace, "--url", f"http://127.0.0.1:{free_port_without_listener()}", "-o", tmp_path / "r.pq")
    assert done.returncode == 2
    assert done.stderr.startswith("error: cannot reach the server at") and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr + done.stdout


def test_bad_options_are_one_line_exit_2(tmp_path: Path) -> None:
    trace = make_trace(n=2).write(tmp_path / "t.parquet")
    for args, needle in (
        (["--workers", "0"], "--workers"),
        (["--api", "embeddings"], "--api"),
        (["--time-scale", "0"], "--time-scale"),
    ):
        done = cli("replay", trace, "--url", "http://127.0.0.1:1", "-o", tmp_path / "r.pq", *args)
        assert done.returncode == 2 and done.stderr.startswith("error: ") and needle in done.stderr
    done = cli("replay", tmp_path / "missing.parquet", "--url", "http://127.0.0.1:1", "-o", tmp_path / "r.pq")
    assert done.returncode == 2 and "no such trace file" in done.stderr
    done = cli("replay", trace, "--url", "127.0.0.1:1", "-o", tmp_path / "r.pq")
    assert done.returncode == 2 and "not an http(s) URL" in done.stderr
    done = cli("replay-recover", tmp_path / "r.pq")
    assert done.returncode == 2 and "nothing to recover" in done.stderr


def test_unwritable_output_fails_before_sending(ok_url: str, tmp_path: Path) -> None:
    trace = make_trace(n=2).write(tmp_path / "t.parquet")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    done = cli("replay", trace, "--url", ok_url, "-o", blocker / "r.parquet")
    assert done.returncode == 2 and done.stderr.startswith("error: cannot create") and "Traceback" not in done.stderr
    done = cli("replay", trace, "--url", ok_url, "-o", tmp_path)
    assert done.returncode == 2 and "not a directory" in done.stderr
