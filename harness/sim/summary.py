"""The one-screen summary `replaybench simulate` ends with (labelled SIMULATED)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.sim.engine_spec import EngineSpec
from harness.sim.noise import StepNoise
from harness.sim.virtual import VirtualRun


def summarise(
    run: VirtualRun, spec: EngineSpec, arm: str, path: Path, wall_s: float, noise: StepNoise | None = None
) -> str:
    ttft, gaps = [], []
    served = rejected = 0
    for timing in run.requests:
        if timing.rejected:
            rejected += 1
            continue
        times = run.token_times(timing)
        served += 1
        ttft.append(times[0] - timing.spec.arrival_s)
        gaps.extend(np.diff(times))
    end = max((s + d for s, d in zip(run.step_starts, run.step_durations, strict=True)), default=0.0)

    def pct(values: list[float], q: float, scale: float) -> str:
        return f"{np.percentile(values, q) * scale:.1f}" if values else "-"

    return "\n".join(
        [
            f"[bold]SIMULATED ENGINE[/bold] result ({spec.policy.label} on {spec.tensor_parallel_size} x "
            f"{spec.gpu.name}, model {spec.shape.name})",
            f"  arm {arm}: {served} requests served, {rejected} rejected (too long), {run.preemptions} preemptions",
            f"  step-time noise: {noise.label() if noise else 'off'}",
            f"  virtual span {end:.1f} s simulated in {wall_s:.1f} s wall ({len(run.step_durations)} steps)",
            f"  TTFT p50 {pct(ttft, 50, 1e3)} ms, p99 {pct(ttft, 99, 1e3)} ms; "
            f"ITL p50 {pct(gaps, 50, 1e3)} ms, p99 {pct(gaps, 99, 1e3)} ms",
            f"  wrote {path} (metadata replaybench.simulated=true)",
        ]
    )
