"""Paired statistics over repeats (DESIGN §7): the repeat, not the request, is the replicate.

Every function works on the *worse-is-positive* log-ratio `w = ±log(candidate / baseline)` (sign flipped for
metrics where higher is better), so one set of formulas serves every metric. Arrays may carry leading
axes (many simulated experiments at once); the last axis is the repeat.

Margins: a metric is "worse by more than δ" when its ratio is beyond 1 + δ in the bad direction and
"better by more than δ" when beyond 1 / (1 + δ) in the good direction; i.e. ±log(1 + δ) on the log scale.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np
from scipy import optimize, stats


class Verdict(StrEnum):
    IMPROVEMENT = "IMPROVEMENT"
    REGRESSION = "REGRESSION"
    EQUIVALENT = "EQUIVALENT"
    INCONCLUSIVE = "INCONCLUSIVE"


def t_interval(w: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean, standard error, and the two-sided (1 - alpha) t-interval over the last axis."""
    w = np.asarray(w, float)
    n = w.shape[-1]
    mean = w.mean(axis=-1)
    se = w.std(axis=-1, ddof=1) / np.sqrt(n)
    half = stats.t.ppf(1 - alpha / 2, n - 1) * se
    return mean, se, mean - half, mean + half


def verdicts(low: np.ndarray, high: np.ndarray, margin: float | np.ndarray) -> np.ndarray:
    """Classify each worse-is-positive CI against ±log(1 + margin)."""
    bound = np.log1p(margin)
    return np.select(
        [high < -bound, low > bound, (low >= -bound) & (high <= bound)],
        [Verdict.IMPROVEMENT.value, Verdict.REGRESSION.value, Verdict.EQUIVALENT.value],
        Verdict.INCONCLUSIVE.value,
    )


def non_inferior(high: np.ndarray, margin: float | np.ndarray) -> np.ndarray:
    """Non-inferiority at level alpha/2: the CI's worse end stays below +log(1 + margin)."""
    return np.asarray(high) < np.log1p(margin)


def p_worse_than_margin(mean: np.ndarray, se: np.ndarray, n: int, margin: float | np.ndarray) -> np.ndarray:
    """One-sided p-value of H0 "worse by at most δ" (small p: a regression beyond the margin)."""
    excess = np.asarray(mean) - np.log1p(margin)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, excess / np.where(se > 0, se, 1.0), np.sign(excess) * np.inf)
    return np.where(np.isnan(t), 1.0, stats.t.sf(t, n - 1))


def p_two_sided(mean: np.ndarray, se: np.ndarray, n: int) -> np.ndarray:
    """Two-sided p-value of "no change" (log-ratio zero)."""
    mean, se = np.asarray(mean, float), np.asarray(se, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, np.abs(mean) / np.where(se > 0, se, 1.0), np.where(mean == 0, 0.0, np.inf))
    return 2 * stats.t.sf(t, n - 1)


def holm(p_values: np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values over the last axis (family-wise error control)."""
    p = np.asarray(p_values, float)
    m = p.shape[-1]
    order = np.argsort(p, axis=-1)
    ranked = np.take_along_axis(p, order, axis=-1) * (m - np.arange(m))
    ranked = np.minimum(np.maximum.accumulate(ranked, axis=-1), 1.0)
    adjusted = np.empty_like(ranked)
    np.put_along_axis(adjusted, order, ranked, axis=-1)
    return adjusted


def benjamini_hochberg(p_values: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (q-values) over the last axis (false-discovery-rate control)."""
    p = np.asarray(p_values, float)
    m = p.shape[-1]
    order = np.argsort(p, axis=-1)
    ranked = np.take_along_axis(p, order, axis=-1) * m / np.arange(1, m + 1)
    ranked = np.minimum(np.minimum.accumulate(ranked[..., ::-1], axis=-1)[..., ::-1], 1.0)
    adjusted = np.empty_like(ranked)
    np.put_along_axis(adjusted, order, ranked, axis=-1)
    return adjusted


def p_upper_below(bound: np.ndarray, mean: np.ndarray, sd: np.ndarray, n: np.ndarray, alpha: float) -> np.ndarray:
    """Probability that the (1 - alpha) t-interval's upper end falls below `bound` when each of `n` repeats
    gives a log-ratio ~ N(mean, sd²): (bound - x̄) / (s / √n) is non-central t with n - 1 degrees of freedom
    and non-centrality (bound - mean) √n / sd. Zero noise decides by the sign of bound - mean."""
    bound, mean, sd, n = np.broadcast_arrays(*(np.asarray(v, float) for v in (bound, mean, sd, n)))
    with np.errstate(divide="ignore", invalid="ignore"):
        noncentral = (bound - mean) * np.sqrt(n) / np.where(sd > 0, sd, 1.0)
    power = stats.nct.sf(stats.t.ppf(1 - alpha / 2, n - 1), n - 1, noncentral)
    return np.where(sd > 0, power, (mean < bound).astype(float))


def keep_power(
    effect: float, target_sd: float, gate_sds: np.ndarray, n: np.ndarray, margins: np.ndarray, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """P(KEEP) under the applied rule at `n` repeats (an array is fine), and each metric's part of it.

    Assumes the target truly improves by the relative `effect` (ratio 1 / (1 + effect)) and every gate metric
    is truly unchanged, each metric independent of the others; `margins` lists the target's first.
    The target must clear -log(1 + δ); each gate's CI must stay below +log(1 + δ) (non-inferiority).
    Returns (P(KEEP), parts) with parts[0] the target's and parts[k] the k-th gate's probability.
    """
    margins = np.asarray(margins, float)
    n = np.asarray(n, float)
    target = p_upper_below(-np.log1p(margins[0]), -np.log1p(effect), target_sd, n, alpha)
    gates = [p_upper_below(np.log1p(m), 0.0, sd, n, alpha) for sd, m in zip(gate_sds, margins[1:], strict=True)]
    parts = np.stack([target, *gates])
    return parts.prod(axis=0), parts


def repeats_to_keep(
    effect: float, target_sd: float, gate_sds: np.ndarray, margins: np.ndarray, alpha: float, power: float, most: int
) -> int | None:
    """Fewest repeats (2..most) whose P(KEEP) under the applied rule reaches `power`; None when none does."""
    n = np.arange(2, most + 1)
    reached = np.flatnonzero(keep_power(effect, target_sd, gate_sds, n, margins, alpha)[0] >= power)
    return int(n[reached[0]]) if len(reached) else None


def detectable_effect(sd: float, n: int, margin: float, alpha: float, power: float) -> float:
    """Smallest true relative improvement whose CI clears the margin with probability `power` at n repeats."""
    bound = np.log1p(margin)
    if sd <= 0 or power <= alpha / 2:  # no noise, or a goal the margin itself already meets
        return float(margin)
    critical = stats.t.ppf(1 - alpha / 2, n - 1)
    noncentral = optimize.brentq(lambda nc: stats.nct.sf(critical, n - 1, nc) - power, 0.0, 1e3)
    return float(np.expm1(bound + noncentral * sd / np.sqrt(n)))


def sd_uncertainty(n: int, alpha: float) -> tuple[float, float]:
    """The (1 - alpha) interval of true sd / estimated sd from n repeats (chi-square, n - 1 degrees of freedom)."""
    df = n - 1
    return (
        float(np.sqrt(df / stats.chi2.ppf(1 - alpha / 2, df))),
        float(np.sqrt(df / stats.chi2.ppf(alpha / 2, df))),
    )
