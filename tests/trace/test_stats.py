"""Trace statistics on traces whose answers are known by construction."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.trace.importers import import_trace
from harness.trace.model import Trace
from harness.trace.stats import compute_stats, requests_per_window
from tests.trace.support import AZURE_CONV, write_jsonl
from tests.trace.test_length_jsonl import MOONCAKE_ROWS


def trace_with(arrivals, **columns):
    n = len(arrivals)
    base = {
        "request_id": [f"r{i}" for i in range(n)],
        "arrival_s": arrivals,
        "api": ["completions"] * n,
        "prompt_tokens": [100] * n,
        "output_tokens": [10] * n,
        "params": ["{}"] * n,
    }
    return Trace.from_columns(base | columns, {})


def test_evenly_spaced_trace_has_zero_burstiness_and_exact_rates():
    stats = compute_stats(trace_with([float(i) for i in range(121)]))  # one request per second for 2 minutes
    assert stats.gap_cv == 0.0
    assert stats.mean_rate == pytest.approx(121 / 120)
    assert stats.peak_requests == 61  # the last minute also holds the final arrival at t = 120
    assert stats.peak_window_s == 60.0


def test_burst_raises_cv_and_peak():
    arrivals = [0.0, 0.1, 0.2, 0.3, 100.0]
    stats = compute_stats(trace_with(arrivals))
    gaps = np.diff(arrivals)
    assert stats.gap_cv == pytest.approx(gaps.std() / gaps.mean())
    assert stats.gap_cv > 1
    assert stats.peak_requests == 4


def test_short_trace_peak_uses_its_own_span():
    stats = compute_stats(trace_with([0.0, 1.0, 2.0, 3.0]))
    assert stats.peak_window_s == 3.0 and stats.peak_requests == 4
    assert stats.peak_rate == pytest.approx(4 / 3)
    assert requests_per_window(np.array([5.0]), 0.0).tolist() == [1]


def test_sessions_tenants_failures_and_text_are_counted():
    trace = trace_with(
        [0.0, 1.0, 2.0, 3.0],
        session_id=["a", "a", "b", None],
        tenant=["t", None, None, None],
        prompt=["hi", None, None, None],
        status=[200, 503, None, None],
        finish_reason=[None, None, "error", "stop"],
    )
    stats = compute_stats(trace)
    assert (stats.sessions, stats.tenants, stats.with_text, stats.failed) == (2, 1, 1, 2)


def test_prefix_reuse_is_the_share_of_blocks_seen_before(tmp_path):
    trace = import_trace("mooncake", write_jsonl(tmp_path / "m.jsonl", MOONCAKE_ROWS)).trace
    # blocks in order: 0 1 | 0 1 2 | 7 | 0 8 -> 8 blocks, 3 repeats
    assert compute_stats(trace).prefix_reuse == pytest.approx(3 / 8)
    assert compute_stats(trace_with([0.0, 1.0])).prefix_reuse is None


def test_azure_conv_matches_its_published_description():
    stats = compute_stats(import_trace("azure", AZURE_CONV).trace)
    assert stats.rows == 19_366
    assert stats.mean_rate == pytest.approx(5.53, abs=0.01)
    assert stats.gap_cv == pytest.approx(1.09, abs=0.01)
    assert (stats.prompt.p50, stats.prompt.p99) == (1020, 4142)
    assert (stats.output.p50, stats.output.p90) == (129, 424)
    assert math.isclose(stats.span_s / 60, 58.4, abs_tol=0.05)
