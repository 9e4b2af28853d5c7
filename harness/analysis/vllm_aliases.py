"""Our per-arm numbers under the names `vllm bench serve --save-result` writes, for dashboards built for it.

Each value is the mean over the given runs (the valid repeats) of that run's own metric, in vLLM's units:
latencies in ms as `mean_/median_/pNN_<name>_ms`, rates per second, token totals of successful requests.
Which of our metrics stands behind which vLLM name is the registry's `vllm_name`; where the definitions
differ (e.g. vLLM's itl is per chunk, ours per token) the registry's peer text says how.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from harness.analysis.run_metrics import RunMetrics
from harness.records.metric_registry import METRICS, QUANTILES

# vLLM's statistic prefix -> ours, and the run totals vLLM saves beside the metrics (token totals: successes).
LATENCY_STATISTICS = {"mean": "mean", "median": "p50", **{q: q for q in QUANTILES}}
TOTALS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens")


def _per_run(run: RunMetrics) -> dict[str, float]:
    out: dict[str, float] = {}
    for metric in METRICS:
        if metric.vllm_name is None:
            continue
        if metric.latency:
            out |= {
                f"{prefix}_{metric.vllm_name}_ms": run.metrics[f"{metric.name}_{ours}"] * 1e3
                for prefix, ours in LATENCY_STATISTICS.items()
            }
        else:
            out[metric.vllm_name] = run.metrics[metric.name]
    ok = run.requests["ok"].to_numpy()
    tokens = (np.nansum(run.requests[column].to_numpy()[ok]) for column in ("prompt_tokens", "output_tokens"))
    totals = (run.duration_s, ok.sum(), (~ok).sum(), *tokens)
    return out | {name: float(value) for name, value in zip(TOTALS, totals, strict=True)}


def vllm_aliases(runs: Sequence[RunMetrics]) -> dict[str, float | None]:
    """Mean over `runs` of each vLLM-named value (None where no run defines it, or there are no runs)."""
    per_run = [_per_run(run) for run in runs]
    out: dict[str, float | None] = {}
    for key in per_run[0] if per_run else ():
        finite = [values[key] for values in per_run if math.isfinite(values[key])]
        out[key] = float(np.mean(finite)) if finite else None
    return out
