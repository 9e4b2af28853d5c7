"""Did both arms find the same share of their prompts in the prefix cache? (server counters, `server_metrics.py`)

Why: the same trace replayed against two servers reuses the same prefixes, so their prefix-cache hit rates should
agree unless the policy under test is the caching itself. When they do not, the latency difference may be cache
state, not policy: one arm with prefix caching off (a plugin that turns it off, a different block size), or one
server kept warm across repeats while the other restarted. This is a warning, not a gate: a caching policy is
expected to move the rate, and the report only says that the difference is there and what it can mean.
"""

from __future__ import annotations

from harness.analysis.model import PrefixCacheCheck, ServerCheckMeans

FIELD = "prefix_cache_hit_rate"


def _rate(value: float | None) -> str:
    return "not counted" if value is None else f"{value:.1%}"


def prefix_cache_check(means: dict[str, ServerCheckMeans], tolerance: float) -> PrefixCacheCheck:
    """Compare the arms' mean hit rate over their valid runs (`means`: arm -> server cross-check means)."""
    rates = {arm: m.server.get(FIELD) for arm, m in means.items()}
    arms = tuple(rates)
    base, cand = rates[arms[0]], rates[arms[-1]]
    shown = " · ".join(f"{arm} {_rate(rate)}" for arm, rate in rates.items())
    if base is None and cand is None:
        return PrefixCacheCheck(hit_rate=rates, tolerance=tolerance, matched=None, line="")
    if base is None or cand is None:
        line = f"{shown} of queried prompt tokens: only one arm's server counts prefix-cache hits"
        return PrefixCacheCheck(hit_rate=rates, tolerance=tolerance, matched=None, line=line)
    apart = abs(cand - base)
    line = f"{shown} of queried prompt tokens ({apart * 100:.1f} points apart; tolerance {tolerance * 100:.0f})"
    if apart > tolerance:
        line += (
            ": unless the candidate's policy is its caching, the arms did not start from the same cache state "
            "(prefix caching off in one arm, another block size, or a server kept warm across repeats), and "
            "latency differences may come from it"
        )
    return PrefixCacheCheck(hit_rate=rates, tolerance=tolerance, matched=apart <= tolerance, line=line)
