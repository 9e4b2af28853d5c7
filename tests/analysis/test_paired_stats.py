"""The statistics core against known values, scipy, and 2,000 simulated A/A experiments."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from harness.analysis.gate_rule import gate_outcomes
from harness.analysis.paired_stats import (
    Verdict,
    benjamini_hochberg,
    holm,
    p_two_sided,
    p_worse_than_margin,
    t_interval,
    verdicts,
)

P_VALUES = np.array([0.01, 0.04, 0.03, 0.005])


def test_holm_matches_hand_computed_values() -> None:
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    np.testing.assert_allclose(holm(P_VALUES), [0.03, 0.06, 0.06, 0.02])


def test_benjamini_hochberg_matches_hand_values_and_scipy() -> None:
    # sorted p * 4 / rank = 0.02, 0.02, 0.04, 0.04 -> running min from the top leaves them unchanged
    np.testing.assert_allclose(benjamini_hochberg(P_VALUES), [0.02, 0.04, 0.04, 0.02])
    p = np.random.default_rng(1).uniform(size=(50, 12)) ** 3
    np.testing.assert_allclose(benjamini_hochberg(p), stats.false_discovery_control(p, axis=-1, method="bh"))


def test_t_interval_matches_scipy_one_sample_t() -> None:
    w = np.array([0.10, 0.05, 0.12, 0.08, 0.02])
    mean, se, low, high = t_interval(w, 0.05)
    reference = stats.ttest_1samp(w, 0.0).confidence_interval(0.95)
    assert mean == pytest.approx(w.mean())
    assert (low, high) == pytest.approx((reference.low, reference.high))
    # DESIGN §7: t(0.975, 4) = 2.776 for five repeats
    assert (high - mean) / se == pytest.approx(2.776, abs=1e-3)
    assert p_two_sided(mean, se, 5) == pytest.approx(stats.ttest_1samp(w, 0.0).pvalue)


def test_verdicts_against_margin() -> None:
    bound = np.log1p(0.05)
    low = np.array([-0.30, 0.06, -0.02, -0.10, -0.30])
    high = np.array([-0.10, 0.20, 0.03, 0.02, -bound / 2])
    assert list(verdicts(low, high, 0.05)) == [
        Verdict.IMPROVEMENT,
        Verdict.REGRESSION,
        Verdict.EQUIVALENT,
        Verdict.INCONCLUSIVE,
        Verdict.INCONCLUSIVE,
    ]


def test_regression_p_value_is_one_sided_against_the_margin() -> None:
    # mean exactly on the margin -> p = 0.5; far above -> ~0; far below -> ~1; zero noise is decided by the sign
    bound = np.log1p(0.05)
    p = p_worse_than_margin(
        np.array([bound, bound + 1, bound - 1, bound + 0.01, bound - 0.01]),
        np.array([0.01, 0.01, 0.01, 0.0, 0.0]),
        5,
        0.05,
    )
    np.testing.assert_allclose(p, [0.5, 0.0, 1.0, 0.0, 1.0], atol=1e-6)


def _aa_log_ratios(rng: np.random.Generator, experiments: int, repeats: int, requests: int) -> np.ndarray:
    """Worse-is-positive log-ratios of (p50 TPOT, p99 TTFT, p99 E2E) for simulated A/A experiments.

    Realistic run-to-run noise: a per-repeat load factor shared by both arms (σ 8 %), a per-run factor (σ 3 %),
    and the sampling noise of quantiles of `requests` lognormal latencies per run.
    """
    shared = rng.normal(0, 0.08, size=(experiments, repeats, 1, 1))
    per_run = rng.normal(0, 0.03, size=(experiments, repeats, 2, 1))
    latencies = rng.lognormal(0, 0.6, size=(experiments, repeats, 2, requests))
    log_quantiles = np.log(np.quantile(latencies, [0.5, 0.99, 0.9], axis=-1)).transpose(1, 2, 3, 0)
    log_values = log_quantiles + shared + per_run  # (experiments, repeats, arm, metric)
    return (log_values[:, :, 1] - log_values[:, :, 0]).transpose(0, 2, 1)  # (experiments, metric, repeats)


AA_EXPERIMENTS = 2_000
ALPHA = 0.05
MC_ERROR = 3 * np.sqrt(ALPHA * (1 - ALPHA) / AA_EXPERIMENTS)  # three Monte-Carlo standard errors


def test_aa_false_decision_rate_equals_alpha_for_one_metric_without_margin() -> None:
    """With the target alone and δ = 0, KEEP and REJECT are the two tails of one t-test: rate = alpha."""
    w = _aa_log_ratios(np.random.default_rng(2026), AA_EXPERIMENTS, repeats=5, requests=400)[:, :1]
    outcomes = gate_outcomes(w, np.array([0.0]), ALPHA)
    false_rate = np.isin(outcomes, ["KEEP", "REJECT"]).mean()
    assert abs(false_rate - ALPHA) < MC_ERROR, false_rate
    assert abs((outcomes == "KEEP").mean() - ALPHA / 2) < MC_ERROR


@pytest.mark.parametrize("margin", [0.0, 0.05])
def test_aa_false_decision_rate_stays_within_alpha_for_the_full_family(margin: float) -> None:
    w = _aa_log_ratios(np.random.default_rng(7), AA_EXPERIMENTS, repeats=5, requests=400)
    outcomes = gate_outcomes(w, np.full(3, margin), ALPHA)
    false_rate = np.isin(outcomes, ["KEEP", "REJECT"]).mean()
    assert false_rate <= ALPHA + MC_ERROR, false_rate


def test_gate_finds_a_real_twenty_percent_improvement() -> None:
    w = _aa_log_ratios(np.random.default_rng(11), 500, repeats=5, requests=400)
    w[:, 0] += np.log(0.8)  # the target really improves by 20 %
    # p99s of 400 requests are noisy (CI half-width ~18 %), so their non-inferiority margins must be wider
    outcomes = gate_outcomes(w, np.array([0.05, 0.5, 0.3]), ALPHA)
    assert (outcomes == "KEEP").mean() > 0.9
    assert (gate_outcomes(w, np.array([0.05, 0.05, 0.05]), ALPHA) == "KEEP").mean() < 0.2  # not shown safe
