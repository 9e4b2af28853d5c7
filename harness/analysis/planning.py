"""Planning the next run for the rule actually applied, labelled as planning, not evidence.

KEEP needs the target's CI to clear its margin, so the question a plan answers is "if the target truly
improves by Δ (> δ), how likely is KEEP at n repeats?" (non-central t), not "would a CI exclude zero?".
Testing against zero advised 14 repeats where 14 repeats KEEP a true 5 % gain 2.5 % of the time (the
statistical review's E1). The gates count too: a gate whose noise it cannot pass caps KEEP (E6).
The noise is this run's own between-repeat sd, itself uncertain (×0.6-2.9 at 5 repeats), so the numbers
guide the next run; they say nothing about this one.
"""

from __future__ import annotations

import numpy as np

from harness.analysis.model import MetricComparison, PlannedMetric, Planning
from harness.analysis.paired_stats import detectable_effect, keep_power, repeats_to_keep, sd_uncertainty
from harness.records.decision_config import DecisionConfig

MOST_REPEATS = 100  # beyond this, "more than 100 repeats" is the useful answer


def _unplanned(repeats: int, decision: DecisionConfig, why: str) -> Planning:
    return Planning(
        repeats=repeats,
        power_goal=decision.power,
        assumed_effect=decision.assumed_effect,
        keep_power=None,
        repeats_needed=None,
        detectable_effect=None,
        gate_power=None,
        sd_range=None,
        metrics=[],
        line=f"Planning (not evidence): {why}.",
    )


def plan_next_run(comparisons: list[MetricComparison], decision: DecisionConfig, repeats: int) -> Planning:
    """P(KEEP) at this run's noise, the repeats that reach `[decision] power`, and the detectable effect."""
    deciding = [c for c in comparisons if c.role != "exploratory"]
    if repeats < 2:
        return _unplanned(repeats, decision, "needs at least 2 valid repeat pairs to measure the noise")
    unknown = [c.metric for c in deciding if c.sd is None]
    if unknown:
        return _unplanned(repeats, decision, f"the noise of {', '.join(unknown)} is unknown (undefined in a repeat)")
    target, gates = deciding[0], deciding[1:]
    effect, alpha, goal = decision.assumed_effect, decision.alpha, decision.power
    margins = np.array([c.margin or 0.0 for c in deciding])
    gate_sds = np.array([c.sd for c in gates], float)
    keep, parts = keep_power(effect, target.sd, gate_sds, repeats, margins, alpha)
    target_power, gate_powers = float(parts[0]), [float(p) for p in parts[1:]]
    needed = repeats_to_keep(effect, target.sd, gate_sds, margins, alpha, goal, MOST_REPEATS)
    detectable = detectable_effect(target.sd, repeats, margins[0], alpha, goal)
    gate_power = float(np.prod(gate_powers))
    sd_range = sd_uncertainty(repeats, alpha)
    metrics = [
        PlannedMetric(metric=target.metric, role="target", sd=target.sd, assumed_change=-effect, power=target_power)
    ]
    metrics += [
        PlannedMetric(metric=c.metric, role="gate", sd=c.sd, assumed_change=0.0, power=p)
        for c, p in zip(gates, gate_powers, strict=True)
    ]
    gates_text = (
        f"; the gates (assumed unchanged) all pass with {gate_power:.0%}, an upper bound on KEEP" if gates else ""
    )
    degenerate = (
        " This run showed no noise at all (a deterministic engine?), so the plan is degenerate."
        if target.sd == 0
        else ""
    )
    line = (
        f"Planning (not evidence), at this run's noise (sd of the per-repeat log-ratio {target.sd:.3f} for "
        f"{target.metric}, uncertain ×{sd_range[0]:.2g}-{sd_range[1]:.2g} from {repeats} repeats): if {target.metric} "
        f"truly improves {effect:.0%}, KEEP has probability {keep:.0%} at {repeats} repeats, "
        f"{_repeats_text(needed, goal)}; "
        f"at {repeats} repeats its CI clears the {margins[0]:.0%} margin with {goal:.0%} probability from a true "
        f"improvement of {detectable:.1%}{gates_text}.{degenerate}"
    )
    return Planning(
        repeats=repeats,
        power_goal=goal,
        assumed_effect=effect,
        keep_power=float(keep),
        repeats_needed=needed,
        detectable_effect=detectable,
        gate_power=gate_power if gates else None,
        sd_range=sd_range,
        metrics=metrics,
        line=line,
    )


def advice(planning: Planning) -> str:
    """The short form for an INCONCLUSIVE reason."""
    if planning.keep_power is None:
        return planning.line.removeprefix("Planning (not evidence): ").rstrip(".")
    noise = "no noise (a deterministic engine?)" if planning.metrics[0].sd == 0 else "this noise"
    return (
        f"planning, not evidence: at {noise} a true {planning.assumed_effect:.0%} improvement is KEPT with "
        f"probability {planning.keep_power:.0%} at {planning.repeats} repeats; "
        f"{_repeats_text(planning.repeats_needed, planning.power_goal)}"
    )


def _repeats_text(needed: int | None, goal: float) -> str:
    return f"about {needed} repeats for {goal:.0%}" if needed else f"more than {MOST_REPEATS} repeats for {goal:.0%}"
