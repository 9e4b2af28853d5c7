"""Per-metric paired comparisons over the valid repeats: ratio, t-interval, verdict, corrections, MDE, bootstrap."""

from __future__ import annotations

import math

import numpy as np

from harness.analysis.block_bootstrap import percentile_interval, resampled_log_ratios
from harness.analysis.gate_rule import regression_p_values
from harness.analysis.model import MetricComparison, Role
from harness.analysis.paired_stats import (
    benjamini_hochberg,
    minimum_detectable_effect,
    non_inferior,
    p_two_sided,
    repeats_to_detect,
    t_interval,
    verdicts,
)
from harness.analysis.run_metrics import RunMetrics
from harness.records.decision_config import DecisionConfig
from harness.records.metric_registry import LATENCY_METRICS, METRIC_DIRECTIONS, QUANTILES


def _maybe(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def _bootstrap_cis(
    pairs: list[tuple[RunMetrics, RunMetrics]], metrics: list[str], decision: DecisionConfig
) -> dict[str, tuple[float, float]]:
    """Two-stage block bootstrap ratio CIs (candidate / baseline) for the quantile metrics among `metrics`."""
    rng = np.random.default_rng(decision.bootstrap.seed)
    out: dict[str, tuple[float, float]] = {}
    for index, kind in enumerate(LATENCY_METRICS):
        wanted = [q for q in QUANTILES if f"{kind}_{q}" in metrics]
        if not wanted:
            continue
        baseline = np.stack([b.histograms[index] for b, _ in pairs])
        candidate = np.stack([c.histograms[index] for _, c in pairs])
        samples = resampled_log_ratios(
            baseline, candidate, tuple(QUANTILES.values()), decision.bootstrap.resamples, rng
        )
        low, high = percentile_interval(samples, decision.alpha)
        for k, q in enumerate(QUANTILES):
            if q in wanted:
                out[f"{kind}_{q}"] = (math.exp(low[k]), math.exp(high[k]))
    return out


def _roles(decision: DecisionConfig) -> list[tuple[str, Role, float | None, str]]:
    """(metric, role, margin, better) for the target, then the gate family, then the exploratory metrics."""
    return [
        (rule.metric, "target" if i == 0 else "gate", rule.margin, rule.better)
        for i, rule in enumerate(decision.decision_rules)
    ] + [(name, "exploratory", None, METRIC_DIRECTIONS[name]) for name in decision.exploratory]


def compare_metrics(pairs: list[tuple[RunMetrics, RunMetrics]], decision: DecisionConfig) -> list[MetricComparison]:
    """Target, gate and exploratory comparisons (in that order) over the valid (baseline, candidate) pairs.

    Log-ratios use `RunMetrics.comparable` (zero counts as half a request); the values shown are the true ones.
    """
    roles = _roles(decision)
    names = [name for name, *_ in roles]
    n = len(pairs)
    baseline = np.array([[b.comparable[m] for b, _ in pairs] for m in names]).reshape(len(names), n)
    candidate = np.array([[c.comparable[m] for _, c in pairs] for m in names]).reshape(len(names), n)
    lower = np.array([better == "lower" for *_, better in roles])
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(lower[:, None], 1, -1) * (np.log(candidate) - np.log(baseline))
    computable = np.isfinite(w).all(axis=1) & (n >= 2)
    margins = np.array([margin or 0.0 for _, _, margin, _ in roles])
    alpha = decision.alpha
    stats_w = np.where(computable[:, None], w, 0.0) if n >= 2 else np.zeros((len(names), 2))
    mean, se, low, high = t_interval(stats_w, alpha)
    n_eff = stats_w.shape[-1]
    p_two = p_two_sided(mean, se, n_eff)
    decisive = np.array([role != "exploratory" for _, role, _, _ in roles])
    p_regression = np.ones(len(names))
    p_regression[decisive] = regression_p_values(stats_w[decisive], margins[decisive], alpha)
    q = np.full(len(names), np.nan)
    exploratory_ok = ~decisive & computable
    if exploratory_ok.any():
        q[exploratory_ok] = benjamini_hochberg(p_two[exploratory_ok])
    verdict = verdicts(low, high, margins)
    per_repeat_sd = np.sqrt(n_eff) * se
    mde = np.expm1(minimum_detectable_effect(per_repeat_sd, n_eff, alpha, decision.power))
    boot = _bootstrap_cis(pairs, [m for m, ok in zip(names, computable, strict=True) if ok], decision) if n >= 2 else {}

    def to_ratio(x: float, lower_is_better: bool) -> float | None:
        return _maybe(math.exp(x if lower_is_better else -x))

    out = []
    for i, (name, role, margin, better) in enumerate(roles):
        ok = bool(computable[i])
        lo, hi = (low[i], high[i]) if lower[i] else (-high[i], -low[i])
        boot_ci = boot.get(name, (None, None))
        out.append(
            MetricComparison(
                metric=name,
                role=role,
                better=better,
                margin=margin,
                baseline=[b.metrics[name] for b, _ in pairs],
                candidate=[c.metrics[name] for _, c in pairs],
                ratio=to_ratio(mean[i], lower[i]) if ok else None,
                ci_low=_maybe(math.exp(lo)) if ok else None,
                ci_high=_maybe(math.exp(hi)) if ok else None,
                verdict=(str(verdict[i]) if ok else "INCONCLUSIVE") if role != "exploratory" else None,
                non_inferior=bool(non_inferior(high[i], margins[i])) if ok and role != "exploratory" else None,
                p_value=_maybe(p_two[i]) if ok else None,
                q_value=_maybe(q[i]),
                p_regression=_maybe(p_regression[i]) if ok and role != "exploratory" else None,
                regression_flag=bool(ok and role != "exploratory" and p_regression[i] < alpha / 2),
                mde=_maybe(mde[i]) if ok else None,
                repeats_needed=(
                    repeats_to_detect(float(per_repeat_sd[i]), math.log1p(margin), alpha, decision.power)
                    if ok and margin
                    else None
                ),
                bootstrap_low=boot_ci[0],
                bootstrap_high=boot_ci[1],
                note=""
                if ok
                else (
                    "needs at least 2 valid repeat pairs"
                    if n < 2
                    else "undefined in some repeat (no successful request, or a zero value)"
                ),
            )
        )
    return out
