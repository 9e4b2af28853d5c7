"""Capacity search (DESIGN §7): the largest trace time compression an arm sustains within its SLO.

Open-loop replay makes throughput equal the offered rate, so capacity is found by offering more: the trace is
replayed at `time_scale` s (compression 1 / s) and bisected, in log space, between a scale that fails and one
that passes until they are within `tolerance` of each other; bounds that do not bracket it may be stepped past.
Attainment is assumed to fall as compression rises (more load never helps); a noisy probe can only misplace the
bracket, which the probe list shows.

A probe is `repeats` replays at one scale. It passes only when **every** replay was valid and attained the
target (`attainment >= [slo] attainment_target`): the capacity is a rate the arm held in all of its runs, not
on average. An invalid replay (the client missed its schedule) or a server that died counts as a failed
probe, and the probe says so: a capacity bracketed by such a probe is bounded by the replay machine.

Pure logic only: `find_capacity` takes a `probe(time_scale)` function, so it is tested on known curves.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Literal

from harness.errors import UserError

# How the search ended: bisected to a bracket, passed even at the heaviest scale tried (capacity is at least the
# value shown), or failed even at the lightest one (no capacity within the range).
Limit = Literal["bisected", "at_least", "below_range"]


@dataclass(frozen=True)
class ProbeRun:
    """One replay of a probe. `attainment` and `cost_per_success` are None when the run produced no usable result."""

    repeat: int
    valid: bool  # replay fidelity held and the server stayed up
    attainment: float | None
    cost_per_success: float | None
    reason: str = ""  # why the run is not valid ("" when it is)
    path: str = ""  # its result file, relative to the run directory


@dataclass(frozen=True)
class Probe:
    """Every replay at one time scale and whether the arm held its SLO target there."""

    time_scale: float
    runs: tuple[ProbeRun, ...]
    passed: bool
    reason: str  # one line: why it passed or failed

    @property
    def compression(self) -> float:
        return 1.0 / self.time_scale


def judge_probe(time_scale: float, runs: tuple[ProbeRun, ...], target: float) -> Probe:
    """A probe passes when every run is valid and its attainment is at least the target."""
    if not runs:
        raise ValueError("a probe needs at least one run")
    invalid = [run for run in runs if not run.valid]
    if invalid:
        first = invalid[0]
        return Probe(
            time_scale,
            runs,
            False,
            f"{len(invalid)} of {len(runs)} replay(s) invalid, counted as failed (r{first.repeat}: {first.reason})",
        )
    worst = min(runs, key=lambda run: run.attainment if run.attainment is not None else -1.0)
    attained = worst.attainment if worst.attainment is not None else 0.0
    verb = "held" if attained >= target else "missed"
    return Probe(
        time_scale,
        runs,
        attained >= target,
        f"worst of {len(runs)} replay(s) attained {attained:.1%}: {verb} the {target:.1%} target",
    )


@dataclass(frozen=True)
class SearchBounds:
    """The time scales searched (`min_scale` is the heaviest load), when to stop bisecting, and how many times the
    search may step past a bound that did not bracket the capacity (each step by the range's own ratio), so that
    narrow bounds, chosen to save probes, never waste the search."""

    min_scale: float
    max_scale: float
    tolerance: float  # stop when pass / fail scales differ by at most this fraction
    expand: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.min_scale < self.max_scale:
            raise UserError(
                f"--min-scale {self.min_scale:g} must be > 0 and below --max-scale {self.max_scale:g}; "
                "e.g. --min-scale 0.1 --max-scale 1 searches compressions 1x to 10x"
            )
        if not 0 < self.tolerance < 1:
            raise UserError(f"--tolerance {self.tolerance:g} must be between 0 and 1 (a fraction: 0.05 = 5 %)")
        if self.expand < 0:
            raise UserError(f"--expand {self.expand} must be 0 or more (steps past a bound that held or failed)")

    @property
    def ratio(self) -> float:
        """The range's width: one expansion step."""
        return self.max_scale / self.min_scale

    @property
    def max_probes(self) -> int:
        """Probes the search can take: both ends, the expansions, then the bisection steps (an expansion leaves a
        bracket as wide as the range, so the steps are the same)."""
        steps = math.log(self.ratio) / math.log1p(self.tolerance)
        return 2 + self.expand + (max(0, math.ceil(math.log2(steps))) if steps > 1 else 0)


@dataclass(frozen=True)
class Capacity:
    """The search's answer for one arm, with every probe it took."""

    limit: Limit
    passing: Probe | None  # the heaviest probe that passed (None: none did)
    failing: Probe | None  # the lightest probe that failed (None: none did)
    probes: tuple[Probe, ...]

    @property
    def max_time_compression(self) -> float | None:
        return self.passing.compression if self.passing is not None else None

    @property
    def cost_per_success_at_capacity(self) -> float | None:
        """Mean cost per successful request over the passing probe's runs."""
        if self.passing is None:
            return None
        costs = [run.cost_per_success for run in self.passing.runs if run.cost_per_success is not None]
        finite = [c for c in costs if math.isfinite(c)]
        return sum(finite) / len(finite) if finite else None

    @property
    def note(self) -> str:
        """One line for people: what the number means and what bounded it."""
        if self.limit == "below_range":
            assert self.failing is not None
            return (
                f"fails even at {self.failing.compression:.3g}x ({self.failing.reason}); "
                "try lighter loads: raise --max-scale or --expand"
            )
        assert self.passing is not None
        if self.limit == "at_least":
            return (
                "holds the SLO at the heaviest load tried (capacity is at least this); "
                "try a lower --min-scale or a larger --expand"
            )
        assert self.failing is not None
        bounded = (
            " (the failing probe's replays were invalid: the replay machine, not the server, set this bound)"
            if any(not run.valid for run in self.failing.runs)
            else ""
        )
        return f"holds {self.passing.compression:.3g}x, fails {self.failing.compression:.3g}x{bounded}"

    def to_json(self, target: float) -> dict[str, object]:
        """The entry of capacity.json: the two keys the report renders, then the evidence."""
        return {
            "max_time_compression": self.max_time_compression,
            "cost_per_success_at_capacity": self.cost_per_success_at_capacity,
            "time_scale_at_capacity": self.passing.time_scale if self.passing is not None else None,
            "first_failing_compression": self.failing.compression if self.failing is not None else None,
            "limit": self.limit,
            "attainment_target": target,
            "rule": "a probe passes when every repeat is a valid replay with attainment >= attainment_target",
            "note": self.note,
            "probes": [
                {
                    "time_scale": p.time_scale,
                    "compression": p.compression,
                    "passed": p.passed,
                    "reason": p.reason,
                    "runs": [asdict(run) for run in p.runs],
                }
                for p in self.probes
            ],
        }


def find_capacity(probe: Callable[[float], Probe], bounds: SearchBounds) -> Capacity:
    """Lightest load first, then the heaviest; past either bound by the range's ratio while it did not bracket the
    capacity (at most `bounds.expand` times); then bisect at log-midpoints."""
    probes: list[Probe] = []

    def take(scale: float) -> Probe:
        result = probe(scale)
        probes.append(result)
        return result

    lightest = take(bounds.max_scale)
    if lightest.passed:
        passing, scale = lightest, bounds.min_scale
        for _ in range(1 + bounds.expand):  # the heaviest bound, then heavier still
            heavier = take(scale)
            if not heavier.passed:
                failing = heavier
                break
            passing, scale = heavier, scale / bounds.ratio
        else:
            return Capacity("at_least", passing, None, tuple(probes))
    else:
        failing, scale = lightest, bounds.max_scale * bounds.ratio
        for _ in range(bounds.expand):  # lighter than the lightest bound
            lighter = take(scale)
            if lighter.passed:
                passing = lighter
                break
            failing, scale = lighter, scale * bounds.ratio
        else:
            return Capacity("below_range", None, failing, tuple(probes))
    while passing.time_scale / failing.time_scale > 1 + bounds.tolerance:
        middle = take(math.sqrt(passing.time_scale * failing.time_scale))
        if middle.passed:
            passing = middle
        else:
            failing = middle
    return Capacity("bisected", passing, failing, tuple(probes))
