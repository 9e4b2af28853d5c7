"""`--workers auto`: the peak token-event rate of a schedule, the worker count formula, and option parsing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.errors import UserError
from harness.experiment.config import ReplaySettings
from harness.records.result_io import read_results
from harness.replay.auto_workers import (
    EVENTS_PER_REQUEST,
    META_WORKERS_AUTO,
    TARGET_BUSY,
    auto_worker_count,
    measured_event_cost_s,
    peak_event_rate,
    size_workers,
)
from harness.replay.options import ReplayOptions, parse_workers
from harness.replay.payloads import PreparedRequest
from tests.replay.support import cli, make_trace


def test_one_request_decoding_for_exactly_one_window() -> None:
    # 100 tokens at 10 ms each: all 102 events fall in one 1 s window
    assert peak_event_rate([0.0], [100], tpot_s=0.01, window_s=1.0) == pytest.approx(100 + EVENTS_PER_REQUEST)


def test_overlapping_requests_add_up_and_distant_ones_do_not() -> None:
    assert peak_event_rate([0.0, 0.0], [100, 100], 0.01, 1.0) == pytest.approx(2 * 102)
    assert peak_event_rate([0.0, 0.5], [100, 100], 0.01, 1.0) == pytest.approx(102 + 51)
    assert peak_event_rate([0.0, 10.0], [100, 100], 0.01, 1.0) == pytest.approx(102)


def test_a_long_decode_is_spread_over_its_duration() -> None:
    # 1,000 tokens over 10 s: a 1 s window holds a tenth of its 1,002 events
    assert peak_event_rate([0.0], [1000], 0.01, 1.0) == pytest.approx(100.2)
    assert peak_event_rate([], [], 0.01, 1.0) == 0.0


def brute_force_peak(starts: list[float], tokens: list[int], tpot_s: float, window_s: float) -> float:
    """Events in [t, t + window] on a fine grid of t, from each request's overlap with the window."""
    start, n = np.array(starts), np.maximum(np.array(tokens, float), 1)
    end = start + n * tpot_s
    grid = np.linspace(start.min() - window_s, end.max(), 4001)
    overlap = np.clip(np.minimum(end, grid[:, None] + window_s) - np.maximum(start, grid[:, None]), 0, None)
    return float(np.max((overlap / (end - start) * (n + EVENTS_PER_REQUEST)).sum(axis=1))) / window_s


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 20), st.integers(0, 400)), min_size=1, max_size=30),
    st.sampled_from([0.005, 0.01, 0.03]),
    st.sampled_from([0.5, 1.0, 2.0]),
)
def test_peak_matches_a_brute_force_scan(requests: list[tuple[float, int]], tpot_s: float, window_s: float) -> None:
    starts, tokens = [r[0] for r in requests], [r[1] for r in requests]
    exact = peak_event_rate(starts, tokens, tpot_s, window_s)
    scanned = brute_force_peak(starts, tokens, tpot_s, window_s)
    assert scanned <= exact * (1 + 1e-9)  # the exact maximum is never below any window's count
    assert exact == pytest.approx(scanned, rel=0.02)  # and the fine scan comes close to it


def test_worker_count_formula() -> None:
    # 20,000 events/s at 25 µs each keep one loop 50 % busy: two workers bring each to the 25 % target
    assert TARGET_BUSY == 0.25
    assert auto_worker_count(20_000, 25e-6, cores=16, requests=1000) == 2
    assert auto_worker_count(20_001, 25e-6, cores=16, requests=1000) == 3
    assert auto_worker_count(100_000, 25e-6, cores=4, requests=1000) == 4  # never more than the cores
    assert auto_worker_count(100_000, 25e-6, cores=16, requests=3) == 3  # nor than the requests
    assert auto_worker_count(0.0, 25e-6, cores=16, requests=0) == 1


def test_event_cost_is_measured_in_this_process() -> None:
    cost = measured_event_cost_s(chunks=200)
    assert 0 < cost < 0.01


def request(index: int, intended_s: float, tokens: int) -> PreparedRequest:
    return PreparedRequest(index, f"r{index}", intended_s, "/v1/completions", b"{}", 8, tokens)


def test_auto_is_resolved_before_the_run_and_its_inputs_are_kept() -> None:
    requests = [request(i, i * 0.001, 500) for i in range(200)]
    sized = size_workers(ReplayOptions(workers="auto", extra_metadata={"x": "y"}), requests, cores=64)
    sizing = json.loads(sized.extra_metadata[META_WORKERS_AUTO])
    assert sized.extra_metadata["x"] == "y" and sizing["workers"] == sized.workers
    expected = auto_worker_count(sizing["peak_event_rate"], sizing["event_cost_s"], 64, 200)
    assert sized.workers == expected >= 1
    assert sizing["peak_event_rate"] == pytest.approx(peak_event_rate([r.intended_s for r in requests], [500] * 200))
    fixed = ReplayOptions(workers=3)
    assert size_workers(fixed, requests, cores=64) is fixed


def test_workers_option_parsing() -> None:
    assert (parse_workers("auto"), parse_workers(" AUTO "), parse_workers("3")) == ("auto", "auto", 3)
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(UserError, match="--workers must be auto or a whole number"):
            parse_workers(bad)
    with pytest.raises(UserError, match="--workers must be auto or at least 1"):
        ReplayOptions(workers="many")  # type: ignore[arg-type]
    assert ReplaySettings(workers="auto").workers == "auto" and ReplaySettings(workers=2).workers == 2
    with pytest.raises(ValueError):
        ReplaySettings(workers=0)


def test_cli_auto_workers_writes_the_sizing_and_the_receive_lag(ok_url: str, tmp_path: Path) -> None:
    trace, out = tmp_path / "t.parquet", tmp_path / "r.parquet"
    make_trace(n=4, gap_s=0.01).write(trace)
    result = cli("replay", trace, "--url", ok_url, "-o", out, "--workers", "auto")
    assert result.returncode == 0, result.stderr
    shown = " ".join(result.stdout.split())  # the console wraps long lines
    assert "receive lag: p50" in shown and "(budget 5 ms); CPU share max" in shown
    _, meta = read_results(out)
    assert meta["replaybench.workers"] == "1"  # four short requests: far below one worker's share
    assert json.loads(meta[META_WORKERS_AUTO])["workers"] == 1
    bad = cli("replay", trace, "--url", ok_url, "-o", tmp_path / "x.parquet", "--workers", "lots")
    assert bad.returncode != 0 and "--workers must be auto or a whole number" in bad.stderr
