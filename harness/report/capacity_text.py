"""Each arm's capacity with the probe that bounds it, and the candidate's gain over the baseline (summary.md and
the report's cost section): a capacity is only as good as its bracket, so the failing probe is always shown."""

from __future__ import annotations

from harness.analysis.model import CapacityEntry


def _times(value: float) -> str:
    return f"{value:.3g}×"


def arm_capacity(entry: CapacityEntry) -> str:
    """'3.22× (fails 3.73×)'; '≥ 2.78×' when even the heaviest probe passed; '—' when none did."""
    if entry.max_time_compression is None:
        failing = entry.first_failing_compression
        return "—" if failing is None else f"< {_times(failing)}"
    if entry.first_failing_compression is None:
        return f"≥ {_times(entry.max_time_compression)}"
    return f"{_times(entry.max_time_compression)} (fails {_times(entry.first_failing_compression)})"


def capacity_gain(capacity: dict[str, CapacityEntry]) -> str | None:
    """Candidate / baseline capacity and the range the two searches' brackets allow, or None without both arms.

    The low end pairs the candidate's passing probe with the baseline's failing one, the high end the reverse;
    an arm without a failing probe leaves that end open, and with both ends open there is no gain to state."""
    baseline, candidate = capacity.get("baseline"), capacity.get("candidate")
    if baseline is None or candidate is None or not baseline.max_time_compression:
        return None
    if candidate.max_time_compression is None:  # the candidate failed even its lightest probe: no ratio to give
        return None
    ratio = candidate.max_time_compression / baseline.max_time_compression
    low = (
        candidate.max_time_compression / baseline.first_failing_compression
        if baseline.first_failing_compression
        else None
    )
    high = (
        candidate.first_failing_compression / baseline.max_time_compression
        if candidate.first_failing_compression
        else None
    )
    if low is not None and high is not None:
        bracket = f"between {low:.2f}× and {high:.2f}× by the probes' brackets"
    elif high is not None:
        bracket = f"at most {high:.2f}× by the probes' brackets"
    elif low is not None:
        bracket = f"at least {low:.2f}× by the probes' brackets"
    else:  # both held even their heaviest probes: the ratio of two lower bounds says nothing
        return None
    return f"candidate / baseline {ratio:.2f}× ({bracket})"


def capacity_line(capacity: dict[str, CapacityEntry]) -> str | None:
    """One line for summary.md, or None when no capacity was measured."""
    if not capacity:
        return None
    arms = " · ".join(f"{arm} {arm_capacity(entry)}" for arm, entry in capacity.items())
    gain = capacity_gain(capacity)
    return f"Capacity (largest time compression within the SLO): {arms}" + (f"; {gain}" if gain else "")
