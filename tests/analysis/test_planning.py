"""Planning for the rule actually applied: the non-central t against direct Monte-Carlo runs of `gate_outcomes`.

Each simulated experiment draws one log-ratio per repeat and metric (the target truly better by the assumed
effect, the gates truly unchanged) and goes through the exact KEEP / REJECT rule.
"""

from __future__ import annotations

import numpy as np
import pytest

from harness.analysis.gate_rule import gate_outcomes
from harness.analysis.model import Estimator, MetricComparison
from harness.analysis.paired_stats import detectable_effect, keep_power, p_upper_below, repeats_to_keep
from harness.analysis.planning import plan_next_run
from harness.records.decision_config import DecisionConfig, MetricRule

ALPHA = 0.05
EXPERIMENTS = 20_000
MC_ERROR = 3 * np.sqrt(0.25 / EXPERIMENTS)  # three standard errors of a simulated probability, at worst


def simulated_keep(effect: float, sds: list[float], margins: list[float], n: int, seed: int) -> float:
    """Share of KEEP among simulated experiments (worse-is-positive log-ratios, metric 0 = target)."""
    rng = np.random.default_rng(seed)
    means = np.array([-np.log1p(effect)] + [0.0] * (len(sds) - 1))
    w = rng.normal(means[:, None], np.array(sds)[:, None], size=(EXPERIMENTS, len(sds), n))
    return float((gate_outcomes(w, np.array(margins), ALPHA) == "KEEP").mean())


@pytest.mark.parametrize(
    ("effect", "sds", "margins", "n"),
    [
        (0.10, [0.0595], [0.05], 5),  # the H200 A/A's TPOT p50 noise, target alone
        (0.10, [0.0205, 0.0731 / 2.9, 0.002], [0.05, 0.15, 0.01], 5),  # ~65 % load, default gates
        (0.10, [0.0205, 0.0731], [0.05, 0.10], 5),  # a ±10 % TTFT p99 gate at the A/A's tail noise caps KEEP
        (0.15, [0.04, 0.05], [0.05, 0.15], 3),
    ],
)
def test_predicted_keep_power_matches_the_simulated_rule(
    effect: float, sds: list[float], margins: list[float], n: int
) -> None:
    predicted, _ = keep_power(effect, sds[0], np.array(sds[1:]), n, np.array(margins), ALPHA)
    assert abs(simulated_keep(effect, sds, margins, n, seed=n) - float(predicted)) < MC_ERROR


def test_repeats_needed_is_the_first_count_the_simulated_rule_keeps_often_enough() -> None:
    sds, margins, effect = [0.0595, 0.03], [0.05, 0.15], 0.10
    n = repeats_to_keep(effect, sds[0], np.array(sds[1:]), np.array(margins), ALPHA, 0.8, 100)
    assert n is not None and n > 5
    assert simulated_keep(effect, sds, margins, n, seed=1) > 0.8 - MC_ERROR
    assert simulated_keep(effect, sds, margins, n - 1, seed=2) < 0.8 + MC_ERROR
    assert repeats_to_keep(effect, 1.0, np.array([]), np.array([0.05]), ALPHA, 0.8, 100) is None


def test_a_true_effect_equal_to_the_margin_is_kept_at_most_alpha_over_two() -> None:
    # The review's E1: the old advice said 14 repeats "detect 5 %", yet 14 repeats KEEP a true 5 % gain 2.5 % of
    # the time, because KEEP needs the CI beyond the margin, not beyond zero.
    predicted, _ = keep_power(0.05, 0.0595, np.array([]), 14, np.array([0.05]), ALPHA)
    assert float(predicted) == pytest.approx(ALPHA / 2)
    assert abs(simulated_keep(0.05, [0.0595], [0.05], 14, seed=3) - ALPHA / 2) < 3 * np.sqrt(0.025 / EXPERIMENTS)


def test_the_review_planning_table_is_reproduced() -> None:
    # shared/research/decision_validity.md §4: sd 0.0595 -> ratio 0.86 kept with 80 % power at n = 5 and 15
    # repeats to KEEP a true 1/1.1; sd 0.0205 (65 % load) -> 0.92 and 4 repeats.
    for sd, ratio, repeats in ((0.0595, 0.86, 15), (0.0205, 0.92, 4), (0.2002, 0.68, 148)):
        assert 1 / (1 + detectable_effect(sd, 5, 0.05, ALPHA, 0.8)) == pytest.approx(ratio, abs=0.005)
        assert repeats_to_keep(0.10, sd, np.array([]), np.array([0.05]), ALPHA, 0.8, 200) == repeats


def test_detectable_effect_has_the_stated_power_in_simulation() -> None:
    effect = detectable_effect(0.04, 5, 0.05, ALPHA, 0.8)
    assert abs(simulated_keep(effect, [0.04], [0.05], 5, seed=4) - 0.8) < MC_ERROR
    assert detectable_effect(0.0, 5, 0.05, ALPHA, 0.8) == 0.05  # no noise: anything beyond the margin


def test_zero_noise_decides_by_the_sign() -> None:
    np.testing.assert_array_equal(p_upper_below(0.1, np.array([0.05, 0.2]), 0.0, 5, ALPHA), [1.0, 0.0])


def _comparison(metric: str, role: str, margin: float, sd: float | None) -> MetricComparison:
    return MetricComparison(
        metric=metric,
        role=role,
        better="lower",
        estimator=Estimator.RUN_QUANTILE,
        margin=margin,
        baseline=[],
        candidate=[],
        ratio=None,
        ci_low=None,
        ci_high=None,
        verdict=None,
        non_inferior=None,
        p_value=None,
        q_value=None,
        p_regression=None,
        regression_flag=False,
        sd=sd,
    )


def test_plan_names_itself_planning_and_uses_the_configured_effect() -> None:
    decision = DecisionConfig(
        target=MetricRule(metric="tpot_p50", margin=0.05),
        gate=(MetricRule(metric="ttft_p99", margin=0.15),),
        planning_effect=0.12,
    )
    plan = plan_next_run(
        [_comparison("tpot_p50", "target", 0.05, 0.03), _comparison("ttft_p99", "gate", 0.15, 0.05)], decision, 5
    )
    expected, parts = keep_power(0.12, 0.03, np.array([0.05]), 5, np.array([0.05, 0.15]), ALPHA)
    assert plan.label == "planning, not evidence" and plan.line.startswith("Planning (not evidence)")
    assert plan.keep_power == pytest.approx(float(expected))
    assert [m.power for m in plan.metrics] == pytest.approx(list(parts))
    assert plan.assumed_effect == 0.12 and "12%" in plan.line
    assert plan.sd_range == pytest.approx((0.599, 2.87), abs=0.01)
    unknown = plan_next_run([_comparison("tpot_p50", "target", 0.05, None)], decision, 5)
    assert unknown.keep_power is None and "unknown" in unknown.line


def test_default_planning_effect_is_twice_the_margin_and_a_smaller_one_is_refused() -> None:
    assert DecisionConfig().assumed_effect == pytest.approx(0.10)
    with pytest.raises(ValueError, match="must exceed the target margin"):
        DecisionConfig(planning_effect=0.05)
