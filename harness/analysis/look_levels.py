"""The level each pre-registered look tests at, so that stopping at whichever look decides keeps a wrong verdict's
chance within alpha.

Bonferroni (alpha / looks at every look) guarantees it but spends a third of alpha on a first look of three repeats
that almost never decides, and so costs power at the last look. O'Brien-Fleming spending (Lan-DeMets form) spends
little early and leaves the last look nearly alpha. Its usual boundaries are for z statistics, whose looks are more
strongly correlated than the few-repeat t statistics the rule uses: applied to t they let the error reach 5.3 % at
looks 3, 5, 8 and alpha 5 % (bench/results/bench_look_levels.md). So the boundaries are set on the t statistics
themselves: simulated paired repeats under no effect (the t statistic's distribution is free of the noise's scale),
the threshold at each look the quantile of the paths that have not yet crossed that spends exactly what the
function allows by then.
"""

from __future__ import annotations

import functools

import numpy as np
from scipy import stats

from harness.records.decision_config import DecisionConfig, LookSpending

# Simulated paths under no effect: the one-sided error they give has a standard error of 0.00035 at 0.025, and the
# fixed seed makes a config's levels the same on every machine and in every re-analysis.
PATHS = 200_000
SEED = 20261205


def obrien_fleming_spent(fraction: np.ndarray, alpha: float) -> np.ndarray:
    """Two-sided alpha spent by information `fraction` (repeats so far / the last look's): Lan-DeMets' form."""
    return 2 * stats.norm.sf(stats.norm.isf(alpha / 2) / np.sqrt(fraction))


def look_levels(alpha: float, looks: tuple[int, ...], spending: LookSpending) -> tuple[float, ...]:
    """The two-sided level each look's tests use (one-sided tests use half), in the order of `looks`."""
    if not looks:
        return (alpha,)
    if spending == "bonferroni" or len(looks) == 1:
        return (alpha / len(looks),) * len(looks)
    return _t_boundary_levels(alpha, looks)


def t_paths(looks: tuple[int, ...], shift: float, paths: int, seed: int) -> np.ndarray:
    """Simulated runs' one-sample t statistics at each look (paths x looks): repeats drawn from N(shift, 1)."""
    repeats = np.asarray(looks)
    draws = np.random.default_rng(seed).standard_normal((paths, repeats[-1])) + shift
    totals = np.cumsum(draws, axis=1)[:, repeats - 1]
    squares = np.cumsum(draws**2, axis=1)[:, repeats - 1]
    means = totals / repeats
    sds = np.sqrt((squares - repeats * means**2) / (repeats - 1))
    return means / (sds / np.sqrt(repeats))


def first_crossing(
    looks: tuple[int, ...], levels: tuple[float, ...], t: np.ndarray, *, two_sided: bool
) -> tuple[float, float]:
    """Of runs with t statistics `t` (paths x looks), the share whose test rejects at some look, and the mean
    repeats they run when each stops at its first rejection. A look's interval is two-sided at its level, so either
    side (`two_sided`: both, as "no change") rejects beyond the same critical value."""
    stopped_at = np.full(len(t), looks[-1])
    crossed = np.zeros(len(t), dtype=bool)
    for k, (n, level) in enumerate(zip(looks, levels, strict=True)):
        statistic = np.abs(t[:, k]) if two_sided else t[:, k]
        now = ~crossed & (statistic > stats.t.isf(level / 2, n - 1))
        stopped_at[now] = n
        crossed |= now
    return float(crossed.mean()), float(stopped_at.mean())


@functools.lru_cache(maxsize=64)
def _t_boundary_levels(alpha: float, looks: tuple[int, ...]) -> tuple[float, ...]:
    """Per-look levels whose one-sided crossings on simulated t paths spend alpha / 2 as O'Brien-Fleming allows."""
    t = t_paths(looks, 0.0, PATHS, SEED)
    spent = obrien_fleming_spent(np.asarray(looks) / looks[-1], alpha) / 2
    crossed = np.zeros(PATHS, dtype=bool)
    levels = []
    for k, n in enumerate(looks):
        allowed = round((spent[k] - (spent[k - 1] if k else 0.0)) * PATHS)
        waiting = np.sort(t[~crossed, k])[::-1]
        threshold = waiting[allowed] if allowed < waiting.size else -np.inf
        crossed |= t[:, k] > threshold
        levels.append(float(2 * stats.t.sf(threshold, n - 1)))
    return tuple(levels)


def levels_of(decision: DecisionConfig) -> tuple[float, ...]:
    """Each look's level under the declared rule (its alpha alone without looks)."""
    return look_levels(decision.family_alpha, decision.looks, decision.look_spending)


def at_look(decision: DecisionConfig, repeats: int) -> DecisionConfig:
    """The rule as the look at `repeats` applies it (between looks, where no verdict is given: the last look's)."""
    levels = levels_of(decision)
    return decision.at_level(levels[decision.looks.index(repeats)] if repeats in decision.looks else levels[-1])


def looks_rule_text(decision: DecisionConfig) -> str:
    """The looks and their levels as the rule states them."""
    levels = ", ".join(f"{level:.3g}" for level in levels_of(decision))
    sharing = (
        f"alpha / {len(decision.looks)}"
        if decision.look_spending == "bonferroni"
        else f"O'Brien-Fleming spending of alpha {decision.family_alpha:g}"
    )
    return f"looks at {decision.looks_text} repeats, at levels {levels} ({sharing})"
