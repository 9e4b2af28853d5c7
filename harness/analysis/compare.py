"""Per-metric paired comparisons over the valid repeats: per-repeat log-ratio, t-interval, verdict, corrections."""

from __future__ import annotations

import math

import numpy as np

from harness.analysis.gate_rule import regression_p_values
from harness.analysis.model import Estimator, MetricComparison, Role
from harness.analysis.paired_stats import benjamini_hochberg, non_inferior, p_two_sided, t_interval, verdicts
from harness.analysis.request_pairing import REQUEST_PAIRED_METRICS, median_log_ratios
from harness.analysis.run_metrics import RunMetrics
from harness.records.decision_config import DecisionConfig
from harness.records.metric_registry import LATENCY_METRICS, METRIC_DIRECTIONS, QUANTILES

QUANTILE_METRICS = frozenset(f"{kind}_{q}" for kind in LATENCY_METRICS for q in QUANTILES)


def _maybe(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def _not_computable(pairs: int, log_ratios: np.ndarray) -> str:
    """Why a metric has no comparison: too few pairs, never measured (energy without GPU samples), or undefined."""
    if pairs < 2:
        return "needs at least 2 valid repeat pairs"
    if not np.isfinite(log_ratios).any():
        return "not measured in any repeat pair"
    return "undefined in some repeat (no successful request, a zero value, or not measured)"


def estimator_of(metric: str, decision: DecisionConfig) -> Estimator:
    """The per-repeat statistic a metric is compared with (pre-declared by `[decision] request_paired`)."""
    if decision.request_paired and metric in REQUEST_PAIRED_METRICS:
        return Estimator.REQUEST_PAIRED
    return Estimator.RUN_QUANTILE if metric in QUANTILE_METRICS else Estimator.RUN_RATIO


def log_ratios(pairs: list[tuple[RunMetrics, RunMetrics]], names: list[str], estimators: list[Estimator]) -> np.ndarray:
    """log(candidate / baseline) per metric (rows) and repeat (columns), each by its metric's estimator.

    Per-run ratios use `RunMetrics.comparable` (a zero count taken as half a request)."""
    paired = [n for n, e in zip(names, estimators, strict=True) if e is Estimator.REQUEST_PAIRED]
    medians = [median_log_ratios(b, c, paired) for b, c in pairs]
    out = np.empty((len(names), len(pairs)))
    with np.errstate(divide="ignore", invalid="ignore"):
        for i, name in enumerate(names):
            for k, (b, c) in enumerate(pairs):
                out[i, k] = medians[k][name] if name in paired else np.log(c.comparable[name] / b.comparable[name])
    return out


def _roles(decision: DecisionConfig) -> list[tuple[str, Role, float | None, str]]:
    """(metric, role, margin, better) for the target, then the gate family, then the exploratory metrics."""
    return [
        (rule.metric, "target" if i == 0 else "gate", rule.margin, rule.better)
        for i, rule in enumerate(decision.decision_rules)
    ] + [(name, "exploratory", None, METRIC_DIRECTIONS[name]) for name in decision.exploratory]


def compare_metrics(pairs: list[tuple[RunMetrics, RunMetrics]], decision: DecisionConfig) -> list[MetricComparison]:
    """Target, gate and exploratory comparisons (in that order) over the valid (baseline, candidate) pairs.

    Each metric's per-repeat log-ratio comes from its estimator (`estimator_of`); the per-run values shown
    beside it are the true ones.
    """
    roles = _roles(decision)
    names = [name for name, *_ in roles]
    estimators = [estimator_of(name, decision) for name in names]
    n = len(pairs)
    lower = np.array([better == "lower" for *_, better in roles])
    w = np.where(lower[:, None], 1, -1) * log_ratios(pairs, names, estimators)
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

    def to_ratio(x: float, lower_is_better: bool) -> float | None:
        return _maybe(math.exp(x if lower_is_better else -x))

    out = []
    for i, (name, role, margin, better) in enumerate(roles):
        ok = bool(computable[i])
        lo, hi = (low[i], high[i]) if lower[i] else (-high[i], -low[i])
        out.append(
            MetricComparison(
                metric=name,
                role=role,
                better=better,
                estimator=estimators[i],
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
                sd=_maybe(per_repeat_sd[i]) if ok else None,
                note="" if ok else _not_computable(n, w[i]),
            )
        )
    return out
