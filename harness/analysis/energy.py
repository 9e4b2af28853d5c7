"""The energy a run's GPUs drew while it replayed, from what was read beside it (experiment/telemetry.py).

Why: cost per successful request prices GPU time; what a serving policy saves in power does not show in it. Energy
per successful request does: a candidate that finishes the same requests in the same time at lower power is cheaper
to run. First choice: each GPU's cumulative NVML energy counter, read once a second and at the ends, interpolated to
the run's window (the counter accumulates everything; experiment/energy_counter.py). Otherwise each GPU's mean
sampled power over the window times the window: nvidia-smi's `power.draw` on Ampere and later is a one-second average
(whose sensor covers about a quarter of the time on A100/H100), one sample a second; a window too short to hold a
sample takes those one interval either side of it. Both sum over the arm's GPUs only, so an arm whose GPUs
replaybench does not know (no `gpus`) gets no figure rather than the whole machine's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

COUNTER = "NVML energy counter"
POWER_SAMPLES = "board power sampled once a second"


@dataclass(frozen=True)
class RunEnergy:
    """Joules over the run's window and how they were measured (`source`), or None with the reason it was not."""

    joules: float | None
    reason: str = ""
    source: str = ""


def _power_in(samples: list[dict], gpu: int, low_s: float, high_s: float) -> list[float]:
    return [
        float(s["power_w"])
        for s in samples
        if s.get("index") == gpu and isinstance(s.get("power_w"), int | float) and math.isfinite(s["power_w"])
        and low_s <= s.get("t_s", math.nan) <= high_s
    ]  # fmt: skip


def _window_power(samples: list[dict], gpu: int, start_s: float, end_s: float, interval_s: float) -> list[float]:
    """The GPU's power samples inside the window; for a window shorter than the interval, those one interval
    either side of it."""
    return _power_in(samples, gpu, start_s, end_s) or _power_in(samples, gpu, start_s - interval_s, end_s + interval_s)


def _counter_joules(samples: list[dict], gpus: list[int], start_s: float, end_s: float) -> float | None:
    """The arm's GPUs' counters interpolated to the window's ends, summed; None unless reads bracket it for each."""
    total_mj = 0.0
    for gpu in gpus:
        reads = sorted((s["t_s"], s["energy_mj"]) for s in samples if s.get("index") == gpu)
        if not reads or reads[0][0] > start_s or reads[-1][0] < end_s:
            return None
        times, counter = np.array(reads).T
        total_mj += float(np.interp(end_s, times, counter) - np.interp(start_s, times, counter))
    return total_mj / 1e3


def run_energy(telemetry: Path, window_unix: tuple[float, float] | None) -> RunEnergy:
    """The energy of the arm's GPUs over `window_unix` (wall clock: the run's first due request to its last end)."""
    if window_unix is None:
        return RunEnergy(None, "the result file has no start time (written before it was recorded)")
    try:
        payload = json.loads(telemetry.read_text())
        t0_unix, gpus, samples = float(payload["t0_unix"]), list(payload["gpus"]), list(payload["gpu"])
        interval_s = float(payload["interval_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return RunEnergy(None, "no telemetry with a start time for this run (written before energy was measured)")
    if not samples and payload.get("gpu_error"):
        return RunEnergy(None, f"no GPU sampled: {payload['gpu_error']}")
    if not gpus:
        return RunEnergy(None, "the arm's GPUs are not known: give the arm `gpus` to measure its energy")
    start, end = window_unix[0] - t0_unix, window_unix[1] - t0_unix
    counted = _counter_joules(list(payload.get("energy") or []), gpus, start, end)
    if counted is not None:
        return RunEnergy(counted, source=COUNTER)
    power = {gpu: _window_power(samples, gpu, start, end, interval_s) for gpu in gpus}
    unsampled = [str(gpu) for gpu, values in power.items() if not values]
    if unsampled:
        error = payload.get("gpu_error") or "no power samples in the run's window"
        return RunEnergy(None, f"GPU {', '.join(unsampled)} not sampled ({error})")
    return RunEnergy(sum(sum(values) / len(values) for values in power.values()) * (end - start), source=POWER_SAMPLES)
