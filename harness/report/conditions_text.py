"""The machine during the runs in one line (summary.md): what to check before blaming an arm for a slow repeat."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import median

from scipy.stats import spearmanr

from harness.analysis.model import RunConditions, RunRow
from harness.analysis.run_conditions import clock_share

THROTTLE_SHARE = 0.9  # a run whose mean SM clock stays below this share of the maximum while busy: throttled
BUSY_GPU_PCT = 50.0  # the clock only says something while the GPU works (an idle one clocks down by design)
STEAL_PCT = 2.0  # CPU steal from this on: the virtual machine's host took cores from the replay or the server
# A run whose server kept at least this many requests waiting on average ran at its capacity: latency includes queueing
QUEUED_MEAN = 1.0
# Runs slower where the GPU was less busy, at one clock: Spearman's rho of TPOT p50 against the GPU's busy share at or
# below this, over at least IDLE_GPU_RUNS runs whose mean SM clocks lie within CLOCK_SPREAD of each other
IDLE_GPU_RHO = -0.7
IDLE_GPU_RUNS = 6
CLOCK_SPREAD = 0.02


def _span(values: Sequence[float | None], unit: str) -> str | None:
    """'10-30 %' over the values given, one number when they agree; None when there are none."""
    seen = [v for v in values if v is not None]
    if not seen:
        return None
    low, high = min(seen), max(seen)
    return f"{low:,.0f}{unit}" if low == high else f"{low:,.0f}-{high:,.0f}{unit}"


def _throttled(runs: Sequence[tuple[RunRow, RunConditions]]) -> list[str]:
    """The runs whose GPUs ran below THROTTLE_SHARE of their maximum clock while busy."""
    names = []
    for run, c in runs:
        share = clock_share(c)
        if share is not None and share < THROTTLE_SHARE and (c.gpu_utilization_mean_pct or 0) >= BUSY_GPU_PCT:
            names.append(f"{run.arm} r{run.repeat} ({share:.0%})")
    return names


def _against_tpot(runs: Sequence[RunRow], value: Callable[[RunRow], float | None]) -> tuple[float, list[float]] | None:
    """Spearman's rho of each run's TPOT p50 against `value` of the run, both relative to its own arm's median (the
    arms' kernels differ, so do their levels), with the values; None below IDLE_GPU_RUNS runs or at two clocks."""
    by_arm: dict[str, list[tuple[float, float, float]]] = {}
    for r in runs:
        c, tpot, seen = r.conditions, r.metrics.get("tpot_p50"), value(r)
        if c is not None and None not in (tpot, seen, c.gpu_sm_mhz_mean):
            by_arm.setdefault(r.arm, []).append((tpot, seen, c.gpu_sm_mhz_mean))
    relative = [
        (tpot / median(p[0] for p in points), seen - median(p[1] for p in points), clock)
        for points in by_arm.values()
        for tpot, seen, clock in points
    ]
    if len(relative) < IDLE_GPU_RUNS:
        return None
    slower, higher, clocks = zip(*relative, strict=True)
    if max(clocks) > min(clocks) * (1 + CLOCK_SPREAD):
        return None  # the clock differed: the throttling warning, not this, is the place to look
    return float(spearmanr(slower, higher).statistic), [p[1] for points in by_arm.values() for p in points]


def idle_gpu_spread(runs: Sequence[RunRow]) -> str | None:
    """Why repeats differ, when the machine says so: the slower runs kept the GPU less busy at one clock, so their
    time went neither to slower kernels nor to throttling, but to how the engine batched its work (fewer, longer
    steps, when vLLM's iteration counter shows it) or to its host side."""
    busy = _against_tpot(runs, lambda r: r.conditions.gpu_utilization_mean_pct if r.conditions else None)
    if busy is None or not busy[0] <= IDLE_GPU_RHO:
        return None
    steps = _against_tpot(runs, lambda r: r.spec_decode.engine_steps_per_s)
    fewer = (
        f", and took fewer engine steps (ρ {steps[0]:.2f}; {_span(steps[1], ' steps/s')})"
        if steps is not None and steps[0] <= IDLE_GPU_RHO
        else ""
    )
    rho, shares = busy
    return (
        f"slower runs kept the GPU less busy at one clock (Spearman ρ {rho:.2f} between each run's TPOT p50 and "
        f"GPU busy share, both against its arm's median, over {len(shares)} runs; busy {_span(shares, ' %')}){fewer}: "
        "their time went to how the engine batched its work or to its host side, not to slower kernels"
    )


def _memory(every: Sequence[RunConditions]) -> str:
    """', memory clock ≥ X MHz, HBM ≤ Y °C' over the runs that sampled them (a memory-bound kernel slows with a
    throttled HBM where the SM clock says nothing); '' for runs from before they were sampled."""
    clocks = [c.gpu_mem_mhz_min for c in every if c.gpu_mem_mhz_min is not None]
    heat = [c.gpu_memory_temperature_c_max for c in every if c.gpu_memory_temperature_c_max is not None]
    shown = []
    if clocks:
        shown.append(f"memory clock ≥ {min(clocks):,.0f} MHz")
    if heat:
        shown.append(f"HBM ≤ {max(heat):.0f} °C")
    return "".join(f", {part}" for part in shown)


def conditions_line(runs: Sequence[RunRow]) -> str | None:
    """'Machine during the runs: ...' over every run that was sampled; None when none was."""
    sampled: list[tuple[RunRow, RunConditions]] = [(r, r.conditions) for r in runs if r.conditions is not None]
    if not sampled:
        return None
    every = [c for _, c in sampled]
    host = (f"host CPU busy {_span([c.cpu_busy_mean_pct for c in every], ' %')} (run means), steal ≤ "
            f"{max((c.cpu_steal_max_pct or 0.0) for c in every):.1f} %, load ≤ "
            f"{max((c.load1_max or 0.0) for c in every):.1f}")  # fmt: skip
    parts = [host]
    clocks = _span([c.gpu_sm_mhz_mean for c in every], " MHz")
    if clocks:
        top = max((c.gpu_max_sm_mhz or 0.0) for c in every)
        lowest = min(c.gpu_sm_mhz_min for c in every if c.gpu_sm_mhz_min is not None)
        gpu = f"GPU SM clock {clocks} (run means; lowest sample {lowest:,.0f}, maximum {top:,.0f})"
        power = _span([c.gpu_power_w_mean for c in every], " W")
        temperature = max((c.gpu_temperature_c_max or 0.0) for c in every)
        parts.append(f"{gpu}, {power} mean power, ≤ {temperature:.0f} °C" + _memory(every))
    else:
        parts.append(next((c.gpu_error for c in every if c.gpu_error), "GPUs not sampled"))
    warnings = []
    throttled = _throttled(sampled)
    if throttled:
        warnings.append(f"GPU clock below {THROTTLE_SHARE:.0%} of its maximum while busy in {', '.join(throttled)}")
    stolen = [f"{r.arm} r{r.repeat}" for r, c in sampled if (c.cpu_steal_max_pct or 0.0) >= STEAL_PCT]
    if stolen:
        warnings.append(f"CPU steal ≥ {STEAL_PCT:g} % in {', '.join(stolen)}")
    spread = idle_gpu_spread(runs)
    if spread:
        parts.append(spread)
    line = f"Machine during the runs (1-s samples, {len(sampled)} runs): " + "; ".join(parts)
    return line + (". ⚠️ " + "; ".join(warnings) if warnings else "")


def _arm_load(rows: Sequence[RunRow]) -> str:
    def mean(values: list[float | None]) -> float:
        return sum(v for v in values if v is not None) / max(1, sum(v is not None for v in values))

    every = [r.conditions for r in rows if r.conditions is not None]
    running, waiting = mean([c.server_running_mean for c in every]), mean([c.server_waiting_mean for c in every])
    most = max((c.server_waiting_max or 0.0) for c in every)
    kv = max((c.server_kv_usage_max or 0.0) for c in every)
    return f"{rows[0].arm} running {running:.1f}, waiting {waiting:.1f} (max {most:.0f}), KV cache ≤ {kv:.1%}"


def engine_load_line(runs: Sequence[RunRow]) -> str | None:
    """'Engine load ...': each arm's mean batch and queue over its sampled runs, and the runs whose server queued
    requests (at capacity: their latency includes queueing); None when no server's gauges were sampled."""
    sampled = [r for r in runs if r.conditions is not None and r.conditions.server_running_mean is not None]
    if not sampled:
        return None
    arms = dict.fromkeys(r.arm for r in sampled)
    shown = " · ".join(_arm_load([r for r in sampled if r.arm == arm]) for arm in arms)
    queued = [
        f"{r.arm} r{r.repeat} ({r.conditions.server_waiting_mean:.1f})"
        for r in sampled
        if (r.conditions.server_waiting_mean or 0.0) >= QUEUED_MEAN
    ]
    samples = sum(r.conditions.server_samples for r in sampled)
    line = f"Engine load (server gauges, {samples} samples in {len(sampled)} runs, run means): {shown}"
    if queued:
        line += (
            f". ⚠️ requests waited for the batch (mean ≥ {QUEUED_MEAN:g}) in {', '.join(queued)}: those servers ran at "
            "their capacity, so their latencies include queueing"
        )
    return line
