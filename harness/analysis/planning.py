"""Planning for the rule actually applied: KEEP needs the target's CI beyond its margin, not beyond zero.

KEEP's target condition is: the upper end of the two-sided (1 - alpha) t-interval of the worse-is-positive
log-ratio lies below -log(1 + margin). If the true log-ratio is -effect (an improvement of `effect` on the log
scale) and the per-repeat paired sd is `sd`, then with n repeats

    T = (mean + log(1 + margin)) / (s / sqrt(n))  ~  non-central t, df = n - 1,
                                                     nc = (log(1 + margin) - effect) sqrt(n) / sd

and KEEP's target condition is T < -t(1 - alpha/2, n - 1). A true change exactly at the margin is kept with
probability alpha/2, whatever n is: planning must assume a true effect beyond the margin. Gate metrics are
not part of this power (each must also pass its own non-inferiority margin), so it is an upper bound for KEEP.
These numbers are planning, not evidence: `sd` is itself an estimate.
"""

from __future__ import annotations

import math

from scipy import optimize, stats


def keep_power(n: int, sd: float, effect: float, margin: float, alpha: float) -> float:
    """Probability that n repeats put the target's CI beyond its margin when the true log improvement is `effect`."""
    bound = math.log1p(margin)
    if sd <= 0:
        return 1.0 if effect > bound else 0.0
    df = n - 1
    critical = stats.t.ppf(1 - alpha / 2, df)
    return float(stats.nct.cdf(-critical, df, (bound - effect) * math.sqrt(n) / sd))


def repeats_to_keep(sd: float, effect: float, margin: float, alpha: float, power: float, most: int = 100) -> int | None:
    """Fewest repeats (>= 2) that KEEP a true log improvement `effect` with probability `power`; None beyond `most`."""
    for n in range(2, most + 1):
        if keep_power(n, sd, effect, margin, alpha) >= power:
            return n
    return None


def smallest_kept_effect(n: int, sd: float, margin: float, alpha: float, power: float) -> float:
    """The true log improvement that n repeats KEEP with probability `power` (always beyond the margin)."""
    bound = math.log1p(margin)
    if sd <= 0:
        return bound
    high = bound + sd
    while keep_power(n, sd, high, margin, alpha) < power:
        high += 4 * sd
    return float(optimize.brentq(lambda e: keep_power(n, sd, e, margin, alpha) - power, bound, high, xtol=1e-9))


def sd_interval(sd: float, pairs: int, level: float = 0.95) -> tuple[float, float]:
    """Confidence interval of a normal sd estimated from `pairs` values (chi-square, pairs - 1 df)."""
    df = pairs - 1
    tail = (1 - level) / 2
    return (
        sd * math.sqrt(df / stats.chi2.ppf(1 - tail, df)),
        sd * math.sqrt(df / stats.chi2.ppf(tail, df)),
    )
