"""The levels of pre-registered looks: checked by simulating the rule's own t tests on fresh paired repeats (a seed
other than the one that set the boundaries), under no effect (the error) and under one (the power)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from harness.analysis.look_levels import at_look, look_levels, looks_rule_text
from harness.records.decision_config import DecisionConfig

PATHS = 100_000


def crossed(looks: tuple[int, ...], levels: tuple[float, ...], effect: float, *, one_sided: bool = False) -> float:
    """The share of simulated runs whose t test rejects "no effect" at some look (repeats' SD 1)."""
    draws = np.random.default_rng(99).standard_normal((PATHS, looks[-1])) + effect
    hit = np.zeros(PATHS, dtype=bool)
    for n, level in zip(looks, levels, strict=True):
        t = draws[:, :n].mean(axis=1) / (draws[:, :n].std(axis=1, ddof=1) / np.sqrt(n))
        hit |= (t if one_sided else np.abs(t)) > stats.t.isf(level / 2, n - 1)
    return float(hit.mean())


@pytest.mark.parametrize("looks", [(3, 5, 8), (4, 8, 12), (3, 4, 5, 6, 7, 8)])
def test_obrien_fleming_keeps_the_error_within_alpha_and_beats_bonferronis_power(looks: tuple[int, ...]) -> None:
    levels = look_levels(0.05, looks, "obrien-fleming")
    se = np.sqrt(0.05 * 0.95 / PATHS)
    assert abs(crossed(looks, levels, 0.0) - 0.05) < 3 * se
    assert abs(crossed(looks, levels, 0.0, one_sided=True) - 0.025) < 3 * np.sqrt(0.025 * 0.975 / PATHS)
    bonferroni = look_levels(0.05, looks, "bonferroni")
    assert bonferroni == (0.05 / len(looks),) * len(looks)
    assert list(levels) == sorted(levels) and levels[-1] > 2 * bonferroni[-1]  # little spent early, much kept late
    assert crossed(looks, levels, 0.8) > crossed(looks, bonferroni, 0.8) + 0.1


def test_without_looks_or_with_one_the_level_is_alpha() -> None:
    assert look_levels(0.05, (), "obrien-fleming") == (0.05,)
    assert look_levels(0.1, (6,), "obrien-fleming") == (0.1,)


def test_a_look_applies_its_level_and_keeps_the_declared_alpha() -> None:
    declared = DecisionConfig(looks=(3, 5, 8))
    levels = look_levels(0.05, (3, 5, 8), "obrien-fleming")
    second = at_look(declared, 5)
    assert second.alpha == levels[1] and second.family_alpha == 0.05
    assert at_look(second, 8).alpha == levels[2]  # a look's copy gives the same levels: no second division
    assert at_look(declared, 4).alpha == levels[2]  # between looks (no verdict given): the last look's level
    assert at_look(DecisionConfig(), 5).alpha == 0.05
    assert looks_rule_text(second) == (
        f"looks at 3, 5, 8 repeats, at levels {levels[0]:.3g}, {levels[1]:.3g}, {levels[2]:.3g} (O'Brien-Fleming "
        "spending of alpha 0.05)"
    )
