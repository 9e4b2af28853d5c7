"""The capacity line: each arm's capacity with the probe that bounds it, and the gain the two brackets allow."""

from __future__ import annotations

from harness.analysis.model import CapacityEntry
from harness.report.capacity_text import arm_capacity, capacity_gain, capacity_line


def _entry(holds: float | None, fails: float | None) -> CapacityEntry:
    return CapacityEntry(max_time_compression=holds, first_failing_compression=fails)


def test_bisected_arms_show_their_bracket_and_the_gain_range() -> None:
    """Session 18's spec-decode A/B on the H200: native holds 3.22x (fails 3.73x), ReplaySSM 4.02x (fails 4.48x)."""
    capacity = {"baseline": _entry(3.2175, 3.7268), "candidate": _entry(4.0174, 4.4843)}
    assert capacity_line(capacity) == (
        "Capacity (largest time compression within the SLO): baseline 3.22× (fails 3.73×) · "
        "candidate 4.02× (fails 4.48×); candidate / baseline 1.25× (between 1.08× and 1.39× by the probes' brackets)"
    )


def test_an_open_bracket_bounds_the_gain_on_one_side_only() -> None:
    baseline_held_all = {"baseline": _entry(2.78, None), "candidate": _entry(4.0, 4.5)}
    assert arm_capacity(baseline_held_all["baseline"]) == "≥ 2.78×"
    assert capacity_gain(baseline_held_all) == "candidate / baseline 1.44× (at most 1.62× by the probes' brackets)"
    candidate_held_all = {"baseline": _entry(3.0, 3.5), "candidate": _entry(5.0, None)}
    assert capacity_gain(candidate_held_all) == "candidate / baseline 1.67× (at least 1.43× by the probes' brackets)"


def test_no_gain_without_a_failing_probe_or_a_second_arm() -> None:
    assert capacity_gain({"baseline": _entry(2.0, None), "candidate": _entry(2.0, None)}) is None
    assert capacity_gain({"baseline": _entry(3.0, 3.5)}) is None
    assert capacity_gain({"baseline": _entry(3.0, 3.5), "candidate": _entry(None, 1.5)}) is None
    assert arm_capacity(_entry(None, 1.5)) == "< 1.5×" and arm_capacity(_entry(None, None)) == "—"
    assert capacity_line({}) is None
    assert capacity_line({"baseline": _entry(3.0, 3.5)}) == (
        "Capacity (largest time compression within the SLO): baseline 3× (fails 3.5×)"
    )
