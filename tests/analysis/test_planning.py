"""Planning for the KEEP rule: the non-central t power matches the rule applied to simulated experiments."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.analysis.paired_stats import t_interval
from harness.analysis.planning import keep_power, repeats_to_keep, sd_interval, smallest_kept_effect

MARGIN, ALPHA = 0.05, 0.05


def simulated_keep_rate(n: int, sd: float, effect: float, experiments: int = 40_000) -> float:
    """How often the t-interval of n normal log-ratios (true value -effect) lies below -log(1 + margin)."""
    w = np.random.default_rng(1).normal(-effect, sd, size=(experiments, n))
    _, _, _, high = t_interval(w, ALPHA)
    return float(np.mean(high < -math.log1p(MARGIN)))


@pytest.mark.parametrize(("n", "sd", "effect"), [(5, 0.021, math.log(1.1)), (5, 0.06, math.log(1.1)), (10, 0.04, 0.09)])
def test_keep_power_is_the_rate_of_the_rule_itself(n: int, sd: float, effect: float) -> None:
    expected = keep_power(n, sd, effect, MARGIN, ALPHA)
    assert simulated_keep_rate(n, sd, effect) == pytest.approx(expected, abs=0.01)


def test_a_true_change_at_the_margin_is_kept_at_alpha_over_two_whatever_n() -> None:
    # the review's example: the H200 A/A noise and 14 repeats keep a true 5 % gain 2.5 % of the time
    for n in (3, 14, 50):
        assert keep_power(n, 0.0595, math.log1p(MARGIN), MARGIN, ALPHA) == pytest.approx(ALPHA / 2)


def test_repeats_and_smallest_kept_effect_agree_with_the_power() -> None:
    effect = math.log(1.1)
    n = repeats_to_keep(0.021, effect, MARGIN, ALPHA, 0.8)
    assert n == 4  # the review's "load at ~65 % of capacity" row
    assert keep_power(n, 0.021, effect, MARGIN, ALPHA) >= 0.8 > keep_power(n - 1, 0.021, effect, MARGIN, ALPHA)
    assert repeats_to_keep(0.2, effect, MARGIN, ALPHA, 0.8) is None  # the near-capacity rerun's noise
    kept = smallest_kept_effect(5, 0.0595, MARGIN, ALPHA, 0.8)
    assert keep_power(5, 0.0595, kept, MARGIN, ALPHA) == pytest.approx(0.8, abs=1e-6)
    assert math.exp(-kept) == pytest.approx(0.861, abs=0.002)  # the review: KEEP at n = 5 needs a ratio <= 0.861
    assert smallest_kept_effect(5, 0.0, MARGIN, ALPHA, 0.8) == math.log1p(MARGIN)


def test_sd_interval_of_five_values() -> None:
    low, high = sd_interval(1.0, 5)
    assert (low, high) == (pytest.approx(0.599, abs=0.001), pytest.approx(2.874, abs=0.001))
