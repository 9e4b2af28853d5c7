"""Where the candidate helps and where it hurts: the paired comparison within request segments (exploratory).

Why: a policy that shortens long prompts' prefill and slows short ones can show no change overall. Both arms replay
the same requests, so within a segment each request is compared with itself, as the request-paired p50s are
(request_pairing.py): per repeat, the median over the segment's requests of log(candidate / baseline), then the
t-interval over repeats; and that median less the whole run's (the same median over every paired request), which
says whether the segment fares differently from the run: an effect everywhere is no finding about a segment.
Segments are the trace's prompt-length and output-length terciles (the same cut points for both arms and every
repeat: trace properties) and, when the trace names two or more tenants, its largest tenants (a policy that
favours one client's traffic at another's cost is what a shared deployment must see). Every (segment, metric) cell
is one exploratory test; q-values are Benjamini-Hochberg over all of them, so looking at many segments does not
manufacture a finding. Segments never decide.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from harness.analysis.model import SegmentComparison
from harness.analysis.paired_stats import benjamini_hochberg, p_two_sided, t_interval
from harness.analysis.request_pairing import paired_requests
from harness.analysis.run_metrics import RunMetrics

# (dimension, the request column that defines it); terciles of the trace's values
LENGTH_DIMENSIONS = (("prompt", "prompt_tokens"), ("output", "expected_output_tokens"))
TENANT = "tenant"  # the request column naming who sent it
MAX_TENANTS = 8  # the trace's largest tenants get a segment each; smaller ones would rarely reach MIN_REQUESTS
METRICS = {"ttft_p50": "ttft_s", "tpot_p50": "tpot_s"}  # request-paired p50s, as the whole-run comparison
MIN_REQUESTS = 20  # fewer paired requests in a segment of a repeat: its median is not compared

# One dimension's segments: their labels, and per repeat each paired request's segment index (-1: in none)
Segmentation = tuple[list[str], list[np.ndarray]]


def _cuts(values: np.ndarray) -> list[float]:
    """The tercile cut points of a trace property; fewer when values repeat (a trace of one prompt length)."""
    finite = values[np.isfinite(values)]
    return sorted(set(np.quantile(finite, [1 / 3, 2 / 3]).tolist())) if len(finite) else []


def _labels(name: str, cuts: list[float]) -> list[str]:
    edges = [f"{cut:,.0f}" for cut in cuts]
    if not edges:
        return [f"every {name} length"]
    low = [f"{name} ≤ {edges[0]} tokens"]
    middle = [f"{name} {a}-{b} tokens" for a, b in itertools.pairwise(edges)]
    return low + middle + [f"{name} > {edges[-1]} tokens"]


def _length_segments(trace: pd.DataFrame, frames: list[pd.DataFrame], name: str, column: str) -> Segmentation:
    cuts = _cuts(trace[column].to_numpy(float))
    return _labels(name, cuts), [np.searchsorted(cuts, f[column].to_numpy(float), side="left") for f in frames]


def _tenant_segments(trace: pd.DataFrame, frames: list[pd.DataFrame]) -> Segmentation:
    """The trace's largest tenants, most requests first; none when it names fewer than two."""
    tenants = trace[TENANT].dropna().value_counts().index[:MAX_TENANTS].tolist()
    if len(tenants) < 2:
        return [], []
    index = {tenant: k for k, tenant in enumerate(tenants)}
    return [f"tenant {t}" for t in tenants], [f[TENANT].map(index).fillna(-1).to_numpy(np.int64) for f in frames]


def _segmentations(trace: pd.DataFrame, frames: list[pd.DataFrame]) -> dict[str, Segmentation]:
    by_length = {name: _length_segments(trace, frames, name, column) for name, column in LENGTH_DIMENSIONS}
    labels, segments = _tenant_segments(trace, frames)
    return by_length | ({TENANT: (labels, segments)} if labels else {})


def _medians(frame: pd.DataFrame, column: str, segment: np.ndarray, count: int) -> np.ndarray:
    """Per segment: the median of log(candidate / baseline) over its usable requests, NaN below MIN_REQUESTS."""
    base, cand = frame[f"{column}_b"].to_numpy(float), frame[f"{column}_c"].to_numpy(float)
    usable = (base > 0) & (cand > 0)
    out = np.full(count, np.nan)
    for k in range(count):
        chosen = usable & (segment == k)
        if chosen.sum() >= MIN_REQUESTS:
            out[k] = np.median(np.log(cand[chosen] / base[chosen]))
    return out


def _tests(w: np.ndarray, alpha: float) -> tuple[np.ndarray, ...]:
    """Mean, CI ends, and BH q-values of each row's per-repeat log-ratios."""
    mean, se, low, high = t_interval(w, alpha)
    return mean, low, high, benjamini_hochberg(p_two_sided(mean, se, w.shape[-1]))


def segment_comparisons(pairs: list[tuple[RunMetrics, RunMetrics]], alpha: float) -> list[SegmentComparison]:
    """One exploratory comparison per (dimension, tercile, metric) over the valid repeat pairs (≥ 2 needed): the
    segment's change, and its change against the whole run's (the same estimator over every paired request)."""
    if len(pairs) < 2:
        return []
    trace = pairs[0][0].requests
    properties = (*(column for _, column in LENGTH_DIMENSIONS), TENANT)
    frames = [paired_requests(b, c, list(METRICS.values()), properties) for b, c in pairs]
    whole = {
        metric: np.array([_medians(f, field, np.zeros(len(f), np.int64), 1)[0] for f in frames])
        for metric, field in METRICS.items()
    }
    rows: list[tuple[str, str, str, int, np.ndarray]] = []
    for dimension, (labels, segments) in _segmentations(trace, frames).items():
        for metric, field in METRICS.items():
            per_repeat = np.stack([_medians(f, field, s, len(labels)) for f, s in zip(frames, segments, strict=True)])
            for k, label in enumerate(labels):
                requests = int(min((s == k).sum() for s in segments))
                rows.append((dimension, label, metric, requests, per_repeat[:, k]))
    kept = [row for row in rows if np.isfinite(row[4]).all() and np.isfinite(whole[row[2]]).all()]
    if not kept:
        return []
    w = np.stack([row[4] for row in kept])
    mean, low, high, q = _tests(w, alpha)
    apart, _, _, q_apart = _tests(w - np.stack([whole[row[2]] for row in kept]), alpha)
    return [
        SegmentComparison(
            dimension=dimension,
            segment=label,
            metric=metric,
            requests=requests,
            ratio=float(np.exp(mean[i])),
            ci_low=float(np.exp(low[i])),
            ci_high=float(np.exp(high[i])),
            q_value=float(q[i]),
            vs_whole=float(np.exp(apart[i])),
            q_vs_whole=float(q_apart[i]),
        )
        for i, (dimension, label, metric, requests, _) in enumerate(kept)
    ]
