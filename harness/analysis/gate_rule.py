"""The decision rule on paired log-ratios, vectorised so that thousands of simulated experiments run at once.

KEEP  : the target's CI lies beyond -δ (improved) AND every decision metric's CI stays below +δ
        (non-inferior). An intersection-union test: each part at level alpha/2, so KEEP errs at most alpha/2.
REJECT: some decision metric is worse by more than its δ, one-sided at alpha/2 after Holm's correction
        over the decision family (target + gate), so REJECT also errs at most alpha/2.
Otherwise INCONCLUSIVE. With one metric and δ = 0 the two errors add up to exactly alpha.
"""

from __future__ import annotations

import numpy as np

from harness.analysis.model import Outcome
from harness.analysis.paired_stats import holm, non_inferior, p_worse_than_margin, t_interval


def regression_p_values(w: np.ndarray, margins: np.ndarray, alpha: float) -> np.ndarray:
    """Holm-adjusted one-sided p-values of "worse by more than δ" over the metric axis (second to last)."""
    mean, se, _, _ = t_interval(w, alpha)
    return holm(p_worse_than_margin(mean, se, w.shape[-1], margins))


def gate_outcomes(w: np.ndarray, margins: np.ndarray, alpha: float) -> np.ndarray:
    """Outcome per experiment from worse-is-positive log-ratios of shape (..., metrics, repeats); metric 0 is
    the target. Returns an array of Outcome values (str) of shape (...)."""
    _, _, _, high = t_interval(w, alpha)
    margins = np.asarray(margins, float)
    reject = (regression_p_values(w, margins, alpha) < alpha / 2).any(axis=-1)
    keep = (high[..., 0] < -np.log1p(margins[0])) & non_inferior(high, margins).all(axis=-1) & ~reject
    return np.where(reject, Outcome.REJECT.value, np.where(keep, Outcome.KEEP.value, Outcome.INCONCLUSIVE.value))
