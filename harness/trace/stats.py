"""What a trace looks like as load: rate, burstiness, peak minute, length percentiles, sessions, prefix reuse."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow.compute as pc

from harness.records.trace_schema import META_BLOCK_SIZE, META_REDACTION, META_SOURCE
from harness.trace.model import Trace
from harness.trace.outcome import failed_mask

PERCENTILES = (50, 90, 99)
MINUTE_S = 60.0


@dataclass(frozen=True)
class LengthSummary:
    mean: float
    p50: float
    p90: float
    p99: float
    max: int


@dataclass(frozen=True)
class TraceStats:
    """Load characteristics of a trace; every field is derived from the trace alone."""

    rows: int
    span_s: float
    mean_rate: float  # requests per second over the span
    peak_window_s: float  # one minute, or the whole span when the trace is shorter
    peak_requests: int  # most requests arriving in one such window (windows counted from the first arrival)
    gap_cv: float | None  # coefficient of variation of inter-arrival gaps (1 = Poisson; > 1 = bursty)
    prompt: LengthSummary
    output: LengthSummary
    sessions: int
    tenants: int
    models: int
    api_counts: dict[str, int]
    with_text: int
    failed: int
    redaction: str
    source: str
    block_size: int | None
    prefix_reuse: float | None  # share of prefix blocks already seen earlier in the trace

    @property
    def peak_rate(self) -> float:
        """Requests per second in the busiest minute."""
        return self.peak_requests / self.peak_window_s if self.peak_window_s > 0 else float("nan")


def _lengths(values: np.ndarray) -> LengthSummary:
    p50, p90, p99 = np.percentile(values, PERCENTILES)
    return LengthSummary(float(values.mean()), float(p50), float(p90), float(p99), int(values.max()))


def _gap_cv(arrivals: np.ndarray) -> float | None:
    gaps = np.diff(arrivals)
    if len(gaps) < 2 or gaps.mean() == 0:
        return None
    return float(gaps.std() / gaps.mean())


def _distinct(trace: Trace, column: str) -> int:
    return int(pc.count_distinct(trace.table.column(column), mode="only_valid").as_py())


def _prefix_reuse(trace: Trace) -> float | None:
    flat = pc.list_flatten(trace.table.column("prefix_block_ids")).to_numpy()
    if len(flat) == 0:
        return None
    return float(1.0 - len(np.unique(flat)) / len(flat))


def compute_stats(trace: Trace) -> TraceStats:
    table = trace.table
    arrivals = trace.arrivals.to_numpy()
    span = float(arrivals[-1] - arrivals[0])
    window = min(MINUTE_S, span)
    apis = pc.value_counts(table.column("api")).to_pylist()
    text = pc.or_(pc.is_valid(table.column("prompt")), pc.is_valid(table.column("messages")))
    block_size = trace.metadata.get(META_BLOCK_SIZE)
    return TraceStats(
        rows=len(trace),
        span_s=span,
        mean_rate=len(trace) / span if span > 0 else float("nan"),
        peak_window_s=window,
        peak_requests=int(requests_per_window(arrivals, window).max()),
        gap_cv=_gap_cv(arrivals),
        prompt=_lengths(table.column("prompt_tokens").to_numpy()),
        output=_lengths(table.column("output_tokens").to_numpy()),
        sessions=_distinct(trace, "session_id"),
        tenants=_distinct(trace, "tenant"),
        models=_distinct(trace, "model"),
        api_counts={v["values"]: int(v["counts"]) for v in apis},
        with_text=int(pc.sum(text).as_py() or 0),
        failed=int(failed_mask(table).sum()),
        redaction=trace.metadata.get(META_REDACTION, "unknown"),
        source=trace.metadata.get(META_SOURCE, "unknown"),
        block_size=int(block_size) if block_size else None,
        prefix_reuse=_prefix_reuse(trace),
    )


def requests_per_window(arrivals: np.ndarray, window_s: float = MINUTE_S) -> np.ndarray:
    """Requests arriving in each consecutive window from the first arrival (all in one when the span is 0)."""
    if window_s <= 0:
        return np.array([len(arrivals)])
    offsets = arrivals - arrivals[0]
    last_window = max(1, math.ceil(offsets[-1] / window_s)) - 1  # the final arrival closes the last window
    return np.bincount(np.minimum(offsets // window_s, last_window).astype(np.int64))


def format_rate(per_second: float) -> str:
    """`5.530 req/s`, or n/a when every request arrives at the same instant."""
    return "n/a (zero span)" if math.isnan(per_second) else f"{per_second:.3f} req/s"


def summary_rows(stats: TraceStats) -> list[tuple[str, str]]:
    """(label, value) lines shared by the terminal table and the HTML page."""

    def lengths(s: LengthSummary) -> str:
        return f"mean {s.mean:,.0f} · p50 {s.p50:,.0f} · p90 {s.p90:,.0f} · p99 {s.p99:,.0f} · max {s.max:,}"

    cv = "n/a (fewer than 3 requests)" if stats.gap_cv is None else f"{stats.gap_cv:.2f} (1 = Poisson, > 1 bursty)"
    reuse = (
        "n/a (no prefix blocks)"
        if stats.prefix_reuse is None
        else (f"{stats.prefix_reuse:.1%} of blocks seen before ({stats.block_size or '?'}-token blocks)")
    )
    rows = [
        ("source", stats.source),
        ("requests", f"{stats.rows:,}"),
        ("span", f"{stats.span_s:,.1f} s ({stats.span_s / MINUTE_S:,.1f} min)"),
        ("mean rate", format_rate(stats.mean_rate)),
        (
            "peak minute",
            f"{stats.peak_requests:,} requests in {stats.peak_window_s:,.0f} s ({format_rate(stats.peak_rate)})",
        ),
        ("burstiness (CV of gaps)", cv),
        ("prompt tokens", lengths(stats.prompt)),
        ("output tokens", lengths(stats.output)),
        ("api", ", ".join(f"{k} {v:,}" for k, v in sorted(stats.api_counts.items()))),
        ("sessions / tenants / models", f"{stats.sessions:,} / {stats.tenants:,} / {stats.models:,}"),
        ("with prompt text", f"{stats.with_text:,} (redaction: {stats.redaction})"),
        ("recorded as failed", f"{stats.failed:,}"),
        ("prefix reuse", reuse),
    ]
    return rows
