"""Workers, the in-flight cap, and result files that survive Ctrl-C, SIGTERM and a killed process."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.records.result_io import read_results
from harness.records.result_schema import META_COMPLETE
from harness.records.worker_load import loads_from_meta
from tests.conftest import ignore_sigint
from tests.replay.support import CLI, cli, make_trace, replay
from tests.support.openai_server import REPO_ROOT, stop_process_group, upstream


def test_two_workers_share_the_schedule(ok_url: str, tmp_path: Path) -> None:
    outcome, table, meta = replay(make_trace(n=10, gap_s=0.01), ok_url, tmp_path / "r.parquet", workers=2)
    assert outcome.complete and outcome.errors == {} and meta["replaybench.workers"] == "2"
    rows = table.to_pylist()
    assert [r["request_id"] for r in rows] == [f"req-{i}" for i in range(10)]
    assert [r["worker"] for r in rows] == [0, 1] * 5  # round-robin shards
    assert all(r["sent_s"] >= r["intended_s"] and r["output_tokens"] == 4 for r in rows)


def test_inflight_cap_queues_and_reports_client_queue(tmp_path: Path) -> None:
    with upstream("ok", token_delay=0.4) as url:  # each request streams for ~1.2 s
        outcome, table, _ = replay(
            make_trace(n=2, gap_s=0.0), url, tmp_path / "r.parquet", max_inflight=1, queue_timeout_s=0.2
        )
    first, second = table.to_pylist()
    assert first["error"] is None and first["output_tokens"] == 4
    assert (second["error"], second["sent_s"], second["status"]) == ("client_queue", None, None)
    assert outcome.errors == {"client_queue": 1}
    assert not outcome.fidelity.valid and outcome.fidelity.client_queue_errors == 1


def test_inflight_cap_sends_late_instead_of_concurrently(tmp_path: Path) -> None:
    with upstream("ok", token_delay=0.05) as url:
        outcome, table, _ = replay(make_trace(n=3, gap_s=0.0), url, tmp_path / "r.parquet", max_inflight=1)
    rows = table.to_pylist()
    assert outcome.errors == {} and [r["output_tokens"] for r in rows] == [4, 4, 4]
    for before, after in itertools.pairwise(rows):  # each waits for the previous one to finish
        assert after["sent_s"] >= before["sent_s"] + before["e2e_s"]
    assert rows[2]["lag_s"] > outcome.fidelity.lag_budget_s and not outcome.fidelity.valid


def start_cli_replay(
    trace_path: Path, url: str, out: Path, preexec_fn: Callable[[], None] | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*CLI, "replay", str(trace_path), "--url", url, "-o", str(out)],
        cwd=REPO_ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=preexec_fn,
    )


def wait_for_rows(segment_dir: Path, rows: int, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        segments = list(segment_dir.glob("worker-*.jsonl"))
        if sum(len(p.read_text().splitlines()) for p in segments) >= rows:
            return
        time.sleep(0.05)
    raise AssertionError(f"the replay never wrote {rows} rows (exit code {proc.poll()})")


@pytest.mark.parametrize(
    ("sig", "started_ignoring_sigint"), [(signal.SIGINT, False), (signal.SIGINT, True), (signal.SIGTERM, False)]
)
def test_interrupted_replay_keeps_finished_rows(
    ok_url: str, tmp_path: Path, sig: signal.Signals, started_ignoring_sigint: bool
) -> None:
    trace_path = make_trace(n=200, gap_s=0.05).write(tmp_path / "t.parquet")
    out = tmp_path / "r.parquet"
    proc = start_cli_replay(trace_path, ok_url, out, ignore_sigint if started_ignoring_sigint else None)
    try:
        wait_for_rows(tmp_path / "r.parquet.partial", 3, proc)
        os.killpg(proc.pid, sig)
        proc.wait(timeout=60)
    finally:
        stop_process_group(proc)
    assert proc.returncode == 130
    table, meta = read_results(out)
    assert meta[META_COMPLETE] == "false" and meta["replaybench.valid"] == "false"
    assert 3 <= table.num_rows < 200
    assert all(r["error"] is None and r["output_tokens"] == 4 for r in table.to_pylist())
    assert not (tmp_path / "r.parquet.partial").exists()
    (load,) = loads_from_meta(meta) or ()  # the worker's receive lag up to the interruption
    assert load.samples > 0 and load.receive_lag_p99_s is not None


def test_killed_replay_is_recovered(ok_url: str, tmp_path: Path) -> None:
    trace_path = make_trace(n=200, gap_s=0.05).write(tmp_path / "t.parquet")
    out = tmp_path / "r.parquet"
    proc = start_cli_replay(trace_path, ok_url, out)
    try:
        wait_for_rows(tmp_path / "r.parquet.partial", 3, proc)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        stop_process_group(proc)
    assert not out.exists()
    again = cli("replay", trace_path, "--url", ok_url, "-o", out)
    assert again.returncode == 2 and "replay-recover" in again.stderr  # never overwrites unrecovered rows
    recovered = cli("replay-recover", out)
    assert recovered.returncode == 0, recovered.stderr
    table, meta = read_results(out)
    assert meta[META_COMPLETE] == "false" and 3 <= table.num_rows < 200
    assert all(r["error"] is None for r in table.to_pylist())
    (load,) = loads_from_meta(meta) or ()  # all but the last 50 ms of the killed worker's probe samples
    assert load.samples > 0
