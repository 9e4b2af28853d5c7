"""What pre-registered looks cost and save (`[decision] looks`, `look_spending`): the chance of a wrong verdict, the
power and the repeats a run uses, measured by simulating the rule's paired t tests on repeats of SD 1, for the
levels replaybench uses (O'Brien-Fleming boundaries set on t) beside the textbook z boundaries, Bonferroni and one
look at the end."""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import optimize, stats

from bench.report import write_results
from harness.analysis.look_levels import first_crossing, look_levels, obrien_fleming_spent, t_paths

ALPHA = 0.05
LOOKS = ((3, 5, 8), (4, 8, 12), (3, 4, 5, 6, 7, 8))
EFFECTS = (0.8, 1.2)  # the true mean of the paired differences, in repeat SDs
PATHS = 400_000
SEED = 7  # not look_levels' seed: its boundaries are checked on fresh draws


def z_boundary_levels(looks: tuple[int, ...], alpha: float) -> tuple[float, ...]:
    """The textbook levels: O'Brien-Fleming spending solved for z statistics (correlation sqrt(n_i / n_j))."""
    n = np.asarray(looks, dtype=float)
    correlation = np.sqrt(np.minimum.outer(n, n) / np.maximum.outer(n, n))
    spent = obrien_fleming_spent(n / n[-1], alpha)
    bounds: list[float] = []
    for k in range(len(n)):
        normal = stats.multivariate_normal(mean=np.zeros(k + 1), cov=correlation[: k + 1, : k + 1], seed=SEED)

        def excess(c: float, k: int = k, normal: Any = normal) -> float:  # a frozen multivariate normal
            limits = np.array([*bounds, c])
            return 1 - normal.cdf(limits, lower_limit=-limits) - spent[k]

        bounds.append(optimize.brentq(excess, 0.5, 10, xtol=1e-7))
    return tuple(float(2 * stats.norm.sf(c)) for c in bounds)


def simulate(looks: tuple[int, ...], levels: tuple[float, ...], effect: float) -> tuple[float, float]:
    """The share of runs whose two-sided t test rejects at some look, and the mean repeats run (stop at the first)."""
    return first_crossing(looks, levels, t_paths(looks, effect, PATHS, SEED), two_sided=True)


def main() -> None:
    rows = []
    for looks in LOOKS:
        schemes = {
            "O'Brien-Fleming on t (replaybench)": look_levels(ALPHA, looks, "obrien-fleming"),
            "O'Brien-Fleming on z (textbook)": z_boundary_levels(looks, ALPHA),
            "Bonferroni": look_levels(ALPHA, looks, "bonferroni"),
            f"one look at {looks[-1]}": (0.0,) * (len(looks) - 1) + (ALPHA,),
        }
        for scheme, levels in schemes.items():
            error, _ = simulate(looks, levels, 0.0)
            row: dict[str, object] = {
                "looks": ", ".join(map(str, looks)),
                "scheme": scheme,
                "levels": ", ".join(f"{level:.3g}" for level in levels),
                "error, no effect": f"{error:.2%}",
            }
            for effect in EFFECTS:
                power, repeats = simulate(looks, levels, effect)
                row[f"power at {effect} SD"] = f"{power:.1%}"
                row[f"mean repeats at {effect} SD"] = f"{repeats:.2f}"
            rows.append(row)
    se = np.sqrt(ALPHA * (1 - ALPHA) / PATHS)
    notes = (
        f"Two-sided paired t tests at alpha {ALPHA:g}, {PATHS:,} simulated runs per cell (seed {SEED}; the error's "
        f"Monte-Carlo SE {se:.2%}); a run stops at the first look whose test rejects. The z boundaries applied to the "
        "few-repeat t statistics exceed alpha; replaybench's, set on t paths of another seed, keep it; Bonferroni "
        "keeps it with less power. Levels of 0 mean no test at that look."
    )
    write_results("bench_look_levels", "Sequential looks: error, power and repeats by how alpha is shared", rows, notes)
