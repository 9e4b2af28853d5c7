"""The load a run was replayed at as a share of the baseline's capacity: every effect is stated with it.

Effects depend on load: a 5 % faster step shows as a TPOT ratio of 0.89 at 66 % of capacity and 0.74 at 99 %
(`../shared/research/decision_validity.md` §2). The share comes from the result files (`replaybench.load_share`,
written when the config set `[trace] load`), else from a capacity.json in the run directory and the replayed
time scale (capacity's time scale / the run's).
"""

from __future__ import annotations

from harness.analysis.model import CapacityEntry
from harness.analysis.run_metrics import RunMetrics


def load_share(runs: list[RunMetrics], capacity: dict[str, CapacityEntry]) -> float | None:
    """The one load share of these runs, or None when it is unknown (or the runs disagree)."""
    declared = {run.load_share for run in runs if run.load_share is not None}
    if declared:
        return declared.pop() if len(declared) == 1 else None
    scales = {run.time_scale for run in runs if run.time_scale}
    at_capacity = getattr(capacity.get("baseline"), "time_scale_at_capacity", None)
    if len(scales) == 1 and isinstance(at_capacity, int | float) and at_capacity > 0:
        return float(at_capacity) / scales.pop()
    return None


def describe_load_share(share: float | None) -> str:
    """The line every report shows beside its effects."""
    if share is None:
        return (
            "Load: not known relative to capacity (set [trace] load = 0.65, or add "
            "`replaybench capacity --run-dir`); effects depend on load"
        )
    return f"Load: {share:.0%} of the baseline's capacity; effects depend on load"
