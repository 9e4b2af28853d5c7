"""From comparisons, validity and quality to KEEP / REJECT / INCONCLUSIVE / INVALID with a one-sentence reason.

Precedence: INVALID (no pre-declared rule, too few valid repeat pairs, required quality missing, the arms'
measured speculative-decoding acceptance lengths differ beyond `acceptance_tolerance`) > REJECT
(a Holm-flagged regression beyond its margin, or a broken quality limit) > INVALID (a decision metric is
undefined, e.g. a run without any successful request) > KEEP (target improved beyond its margin and every
decision metric non-inferior) > INCONCLUSIVE.
The gate family and rule are exactly those of `gate_rule.gate_outcomes`.
"""

from __future__ import annotations

from harness.analysis.look_levels import looks_rule_text
from harness.analysis.model import (
    AcceptanceCheck,
    Decision,
    ExcludedRepeat,
    MetricComparison,
    Outcome,
    Planning,
    QualitySummary,
)
from harness.analysis.planning import advice
from harness.analysis.spec_decode import acceptance_reason
from harness.records.decision_config import DecisionConfig, QualityLimits


def pct(ratio: float | None) -> str:
    """A ratio as a signed percentage change, e.g. 0.82 -> "-18.0%"."""
    return "n/a" if ratio is None else f"{(ratio - 1) * 100:+.1f}%"


def pct_interval(low: float | None, high: float | None) -> str:
    """A ratio interval as percentage changes, e.g. "-21.0% to -15.3%"."""
    return "n/a" if low is None or high is None else f"{pct(low)} to {pct(high)}"


def describe_change(c: MetricComparison) -> str:
    """E.g. `tpot_p50 -18.2% (CI -21.0% to -15.3%)`."""
    return f"{c.metric} {pct(c.ratio)} (CI {pct_interval(c.ci_low, c.ci_high)})"


def confidence_level(alpha: float) -> str:
    """The two-sided intervals' level as shown: "95%", or "97.5%" at alpha 0.025 (sequential looks)."""
    return f"{(1 - alpha) * 100:.3g}%"


def rule_text(decision: DecisionConfig, quality: QualityLimits) -> str:
    """The pre-declared rule in one paragraph, shown in the verdict banner."""
    target = decision.target
    gates = ", ".join(f"{r.metric} ±{r.margin:.0%}" for r in decision.gate) or "none"
    quality_part = f"; quality: pass-rate drop ≤ {quality.max_pass_rate_drop:.0%}" + (
        f", identical outputs ≥ {quality.min_identical_fraction:.0%}" if quality.min_identical_fraction else ""
    )
    paired = (
        "; ttft/tpot/e2e p50 as request-paired median log-ratios, the rest as per-run ratios"
        if decision.request_paired
        else "; per-run ratios"
    )
    return (
        f"KEEP if {target.metric} ({target.better} is better) improves by more than {target.margin:.0%} "
        f"({confidence_level(decision.alpha)} paired t-interval over repeats{paired}) and no decision metric "
        f"({gates}) is worse than its margin at the CI's worse end; REJECT if any decision metric regresses beyond "
        f"its margin (one-sided, Holm, level {decision.alpha / 2:g}) or a quality limit is broken{quality_part}; "
        f"INVALID with fewer than {decision.min_repeats} valid repeat pairs"
        + (
            f"; sequential: {looks_rule_text(decision)}, the run stopping at the first that decides."
            if decision.looks
            else "."
        )
    )


def decide(
    *,
    comparisons: list[MetricComparison],
    decision: DecisionConfig,
    quality_limits: QualityLimits,
    quality: QualitySummary,
    declared: bool,
    repeats_used: list[int],
    excluded: list[ExcludedRepeat],
    planning: Planning,
    config_note: str = "",
    acceptance: AcceptanceCheck | None = None,
    repeats_run: int | None = None,
) -> Decision:
    """Apply the pre-declared rule. `repeats_run`: the repeats the run has begun (for sequential looks)."""
    rule = rule_text(decision, quality_limits)

    def result(outcome: Outcome, reason: str) -> Decision:
        return Decision(outcome=outcome, reason=reason, rule=rule, repeats_used=repeats_used, excluded=excluded)

    deciding = [c for c in comparisons if c.role != "exploratory"]
    if not declared:
        return result(Outcome.INVALID, f"no pre-declared decision rule ({config_note or 'experiment.toml missing'}).")
    if len(repeats_used) < decision.min_repeats:
        named = "; ".join(f"repeat {e.repeat}: {', '.join(e.reasons)}" for e in excluded) or "none excluded"
        return result(
            Outcome.INVALID, f"only {len(repeats_used)} valid repeat pair(s), {decision.min_repeats} needed ({named})."
        )
    if decision.looks and repeats_run not in decision.looks:
        return result(
            Outcome.INVALID,
            f"analysed after {repeats_run} repeat(s), between the pre-registered looks "
            f"({decision.looks_text}): a verdict here would not keep its error within alpha; resume "
            "the run to the next look.",
        )
    if quality_limits.required and not quality.measured:
        return result(Outcome.INVALID, f"quality results are required but missing ({quality.note}).")
    acceptance_differs = acceptance_reason(acceptance)
    if acceptance_differs:
        return result(Outcome.INVALID, acceptance_differs)
    flagged = sorted((c for c in deciding if c.regression_flag), key=lambda c: c.p_regression or 0.0)
    if flagged:
        worst = flagged[0]
        return result(
            Outcome.REJECT,
            f"{describe_change(worst)} is worse than its {worst.margin:.0%} margin"
            + (f" (and {len(flagged) - 1} more)" if len(flagged) > 1 else "")
            + ".",
        )
    if quality.violations:
        return result(Outcome.REJECT, f"quality limit broken: {quality.violations[0]}.")
    undefined = [c.metric for c in deciding if c.ratio is None]
    if undefined:
        return result(
            Outcome.INVALID,
            f"decision metric(s) {', '.join(undefined)} undefined in some repeat (no successful request in a run).",
        )
    target = deciding[0]
    not_shown = [c for c in deciding if not c.non_inferior]
    if target.verdict == "IMPROVEMENT" and not not_shown:
        return result(
            Outcome.KEEP,
            f"{describe_change(target)} beats its {target.margin:.0%} margin and every "
            f"decision metric is non-inferior over {len(repeats_used)} repeats.",
        )
    if target.verdict != "IMPROVEMENT":
        return result(
            Outcome.INCONCLUSIVE,
            f"{describe_change(target)} is not shown better than its {target.margin:.0%} margin ({advice(planning)}).",
        )
    first = not_shown[0]
    return result(
        Outcome.INCONCLUSIVE,
        f"{describe_change(first)} is not shown within its {first.margin:.0%} margin ({advice(planning)}).",
    )
