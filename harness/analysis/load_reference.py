"""Reference numbers for load and stability, from the statistical review of the decision
(`../shared/research/decision_validity.md`, 2026-12-01: noise-free virtual-time sweeps of the embedded engine,
Nemotron-H-8B on an H200, a 150 s Azure conv slice replayed in 45-70 s, and the committed H200 runs).

"Load" is the baseline's offered rate as a share of its SLO capacity: the largest rate at which SLO
attainment stays at its target (`replaybench capacity`). Values between the review's loads are interpolated
linearly; beyond its range the nearest row holds.
"""

from __future__ import annotations

import numpy as np

REVIEW = "statistical review of the decision (shared/research/decision_validity.md)"

# §2 "Elasticity": d log metric / d log step time (% change of the metric per 1 % change in step time).
ELASTICITY_LOADS = np.array([0.66, 0.85, 0.93, 0.99, 1.02, 1.19])
TPOT_P50_ELASTICITY = np.array([2.2, 4.3, 5.6, 5.9, 5.4, 1.45])  # falls past capacity: 256 sequences saturate
TTFT_P50_ELASTICITY = np.array([2.2, 2.9, 4.4, 4.6, 7.4, 13.2])

# §2 detector table: share of requests completed before the last arrival, by load (45-70 s replays; a longer
# replay finishes a larger share at the same load, so there it under-states the load).
COMPLETION_LOADS = np.array([0.66, 0.85, 0.99, 1.19])
COMPLETED_BEFORE_LAST_ARRIVAL = np.array([0.93, 0.86, 0.73, 0.53])

# Thresholds of the stability detectors.
NEAR_CAPACITY_LOAD = 0.75  # TPOT p50 elasticity passes 3 here, the review's "near the knee" mark
PAST_CAPACITY_LOAD = 1.0  # beyond SLO capacity by definition
SUGGESTED_LOAD = 0.65  # the review's recommended operating point (60-70 % of capacity)
COMPLETION_SHARE_NEAR = 0.90  # the table's share at 75 % load (0.897, interpolated): NEAR_CAPACITY_LOAD
# The review's runs spanned 37-68 s of arrivals; in a much shorter replay even a light load leaves many
# requests unfinished at the last arrival, so the share is not judged there.
COMPLETION_MIN_SPAN_S = 30.0
# In-flight growth over the 2nd half of the arrivals, as a share of the arrival rate: the sweep's slopes are
# 0.49, -0.17, -0.76, 0.65 req/s at 66-99 % load (<= 4 % of the rate) and 2.59, 4.76, 5.5 req/s at
# 102, 106, 119 % (15-27 %).
BACKLOG_GROWTH_PAST = 0.10
# Between-repeat sd of the baseline's log TPOT p50 that noise alone gives at ~65 % of capacity: the H200 A/A's
# 0.09-0.11 (at ~92 % load) times the review's 92 % -> 65 % load factor for the sd (x0.35).
AA_SPREAD_FLOOR = 0.035
SPREAD_FACTOR = 2.0  # a spread this many times the floor counts as amplified noise
# Correlation of the arms' log TPOT p50 across repeats: +0.84 in the H200 A/A (~92 % load), -0.48 in the
# rerun (99-102 %). Below zero the arms no longer move together.
CORRELATION_FLOOR = 0.0
CORRELATION_MIN_REPEATS = 5  # with fewer, a correlation is almost uniformly spread whatever the truth
# Drift: the change of the baseline's log TPOT p50 from the first repeat to the last along its Theil-Sen line.
# 4x the A/A floor (0.14, x1.15): noise at the floor gives a fitted first-to-last change of sd 4 / sqrt(10) x the
# floor = 0.044 over 5 repeats, so this is ~3 sd of it; a linear drift this large alone spreads 5 repeats by
# ~1.6x the floor and moves TPOT p50 by 15 %, three times the target's default 5 % margin.
DRIFT_FACTOR = 4.0
DRIFT_LOG_CHANGE = DRIFT_FACTOR * AA_SPREAD_FLOOR
# ... and only when the least-squares slope's 95 % t interval excludes zero. Theil-Sen's own interval is from
# Kendall's tau: at 5 repeats it spans every pairwise slope, so it excludes zero only for a strictly monotone
# series (exact p 0.017; 0.083 with one adjacent pair swapped). The H200 qwen3.5-4b A/B's baseline rose x2.0
# over 5 repeats with a 4 % dip at the last (least squares p = 0.026) and would never fire on it.
DRIFT_MIN_REPEATS = 3  # a t interval needs a residual degree of freedom


def tpot_p50_elasticity(load: float) -> float:
    return float(np.interp(load, ELASTICITY_LOADS, TPOT_P50_ELASTICITY))


def ttft_p50_elasticity(load: float) -> float:
    return float(np.interp(load, ELASTICITY_LOADS, TTFT_P50_ELASTICITY))


def load_from_completion_share(share: float) -> tuple[float | None, bool]:
    """The load at which the review's runs finished this share before the last arrival, and whether it is
    only a lower bound (a share below the heaviest row's). None above the lightest row (0.93 at 66 %:
    lighter loads are not told apart)."""
    if share > COMPLETED_BEFORE_LAST_ARRIVAL[0]:
        return None, False
    load = float(np.interp(share, COMPLETED_BEFORE_LAST_ARRIVAL[::-1], COMPLETION_LOADS[::-1]))
    return load, bool(share < COMPLETED_BEFORE_LAST_ARRIVAL[-1])
