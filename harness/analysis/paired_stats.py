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
from scipy import stats


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


def minimum_detectable_effect(sd: np.ndarray, n: int, alpha: float, power: float) -> np.ndarray:
    """Smallest true log-ratio the paired t-test finds with probability `power` at this noise and n."""
    return (stats.t.ppf(1 - alpha / 2, n - 1) + stats.t.ppf(power, n - 1)) * np.asarray(sd) / np.sqrt(n)


def repeats_to_detect(sd: float, effect: float, alpha: float, power: float, most: int = 100) -> int | None:
    """Fewest repeats whose minimum detectable log-ratio is at most `effect` at per-repeat noise `sd`; None when
    more than `most` would be needed. Plans the next run of an inconclusive experiment."""
    for n in range(2, most + 1):
        if minimum_detectable_effect(sd, n, alpha, power) <= effect:
            return n
    return None
