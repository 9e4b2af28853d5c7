"""Request-level pairing inside one repeat: both arms replay the same requests (same request_id, same trace time).

A per-request latency statistic that compares each request with itself removes the request-to-request
spread (prompt and output lengths, burst position) from the comparison; in the review's simulations the
median over requests of log(candidate / baseline) had 0.7-0.8 times the between-repeat sd of the ratio of
per-run p50s. The repeat stays the replicate: one such median per repeat, then the t-interval over repeats.
Only p50s are paired like this: a tail quantile is not a property of a request (the requests in the tail
differ between arms), so p90/p99 keep per-run quantile ratios; ITL is per gap, not per request.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.analysis.run_metrics import RunMetrics

# Metric -> the per-request column of `RunMetrics.requests` it is the p50 of.
REQUEST_PAIRED_METRICS = {"ttft_p50": "ttft_s", "tpot_p50": "tpot_s", "e2e_p50": "e2e_s"}


def paired_requests(
    baseline: RunMetrics, candidate: RunMetrics, both: list[str], baseline_only: tuple[str, ...] = ()
) -> pd.DataFrame:
    """Requests that succeeded in both arms of one repeat, joined by request id: the `both` columns of each
    arm with the suffixes `_b` / `_c`, and the `baseline_only` columns (trace properties) unsuffixed."""
    left = baseline.requests[["request_id", "ok", *both, *baseline_only]]
    merged = left.merge(candidate.requests[["request_id", "ok", *both]], on="request_id", suffixes=("_b", "_c"))
    return merged[merged["ok_b"] & merged["ok_c"]]


def median_log_ratios(baseline: RunMetrics, candidate: RunMetrics, metrics: list[str]) -> dict[str, float]:
    """Per metric in `metrics` (keys of REQUEST_PAIRED_METRICS): the median over requests of
    log(candidate / baseline) for the same request; NaN when no request has a positive value in both arms."""
    columns = [REQUEST_PAIRED_METRICS[m] for m in metrics]
    frame = paired_requests(baseline, candidate, columns)
    out = {}
    for metric, column in zip(metrics, columns, strict=True):
        base, cand = frame[f"{column}_b"].to_numpy(float), frame[f"{column}_c"].to_numpy(float)
        usable = (base > 0) & (cand > 0)  # False for NaN too (e.g. no TPOT for a one-token answer)
        out[metric] = float(np.median(np.log(cand[usable] / base[usable]))) if usable.any() else float("nan")
    return out
