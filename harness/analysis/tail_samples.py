"""Whether a decision metric's per-run quantile has enough requests beyond it to mean anything.

Why: a per-run p99 of 150 requests is interpolated between its slowest two, so each run's ratio between arms
swings with a single request and the confidence interval narrows only over many repeats. The demo gated on
ttft_p99 over 150 requests a run and came out INCONCLUSIVE on that gate alone (CI -19 % to +39 %, the target's
±2 %; its planning line: about 21 repeats for 80 % power). `check` says so before a run, from the trace's request
count, and the report after it, from the runs' samples. Five beyond the quantile is the line: the H200 A/A that
the default ±15 % ttft_p99 margin was set from (README, "Default margins") ran 774 requests a run (7.7 beyond),
the GPU configs run 500-774; the demo's 1.5 is another matter.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from harness.records.decision_config import DecisionConfig
from harness.records.metric_registry import QUANTILES

if TYPE_CHECKING:  # check.py reads the rule and the text before any run exists, without the analysis' imports
    from harness.analysis.run_metrics import RunMetrics

# Per-request distributions (one sample a successful request); itl and icl pool every gap, thousands a run.
PER_REQUEST = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s"}
MIN_BEYOND = 5  # samples beyond the quantile, in every run, for it to rest on more than one or two requests


def tail_quantiles(decision: DecisionConfig) -> list[tuple[str, str, float]]:
    """(metric, role, quantile) of each decision metric that is a per-run upper quantile of a per-request
    latency, e.g. ("ttft_p99", "gate", 0.99)."""
    rules = [(decision.target.metric, "target"), *((rule.metric, "gate") for rule in decision.gate)]
    found = []
    for metric, role in rules:
        base, _, statistic = metric.rpartition("_")
        if base in PER_REQUEST and statistic in QUANTILES and QUANTILES[statistic] > 0.5:
            found.append((metric, role, QUANTILES[statistic]))
    return found


def thin_tail_text(metric: str, role: str, quantile: float, samples: int, whose: str) -> str | None:
    """One line when `samples` a run leave fewer than MIN_BEYOND beyond `quantile`, naming the fix; else None."""
    beyond = samples * (1 - quantile)
    if beyond >= MIN_BEYOND:
        return None
    needed = math.ceil(MIN_BEYOND / (1 - quantile) - 1e-9)
    lower = "p90" if quantile > 0.9 else "p50"
    return (
        f"{metric} ({role}) rests on the slowest {beyond:.1f} of {samples} {whose}: each run's value swings with "
        f"one request and its CI narrows only over many repeats (a per-run p{round(quantile * 100)} needs "
        f"{needed:,} requests a run for {MIN_BEYOND} beyond it); gate on {metric.rpartition('_')[0]}_{lower}, or "
        "replay more requests a run ([trace] limit or a longer slice)"
    )


def fewest_samples(runs: Iterable[RunMetrics], metric: str) -> int:
    """The fewest successful requests with a value of `metric`'s latency in any of `runs`."""
    column = PER_REQUEST[metric.rpartition("_")[0]]
    counts = [int((run.requests["ok"] & np.isfinite(run.requests[column].astype(float))).sum()) for run in runs]
    return min(counts, default=0)


def thin_tail_notes(runs: list[RunMetrics], decision: DecisionConfig) -> list[str]:
    """The report's notes: each tail quantile the decision rests on that the runs measured from too few requests."""
    notes = []
    for metric, role, quantile in tail_quantiles(decision):
        samples = fewest_samples(runs, metric)
        text = thin_tail_text(metric, role, quantile, samples, "successful requests in the sparsest run")
        if samples and text:
            notes.append(text)
    return notes
