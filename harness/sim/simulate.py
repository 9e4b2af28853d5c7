"""`replaybench simulate`: replay a trace through the simulated engine in virtual time, write a result file.

The result file has the same schema as a real replay's, stamped `replaybench.simulated = "true"`; the send
time equals the intended time (a virtual client has no lag), and token times come from virtual step ends.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from harness.records.result_io import results_table, write_results
from harness.records.result_schema import (
    CONTINUOUS_USAGE,
    META_ARM,
    META_COMPLETE,
    META_OFFERED_RATE,
    META_REPEAT,
    META_SIMULATED,
    META_TIME_SCALE,
    META_TRACE_SOURCE,
    META_URL,
)
from harness.sim.engine_core import EngineCore
from harness.sim.engine_spec import EngineSpec
from harness.sim.noise import StepNoise
from harness.sim.virtual import RequestSpec, RequestTiming, VirtualRun, run_virtual
from harness.trace.model import Trace

META_SIM_POLICY = "replaybench.sim.policy"
META_SIM_GPU = "replaybench.sim.gpu"
META_SIM_MODEL = "replaybench.sim.model"
META_SIM_PREEMPTIONS = "replaybench.sim.preemptions"
META_SIM_NOISE = "replaybench.sim.noise"  # JSON of the step-time noise and its seeds, or "off"
META_SIM_SPECULATION = "replaybench.sim.speculation"  # e.g. "spec k=3 AL=2.8", or "off"


def trace_requests(trace: Trace, time_scale: float) -> list[RequestSpec]:
    names = ["request_id", "arrival_s", "prompt_tokens", "output_tokens", "tenant"]
    columns = trace.table.select(names).to_pydict()
    specs = [
        RequestSpec(rid, arrival * time_scale, max(prompt, 1), out, tenant)
        for rid, arrival, prompt, out, tenant in zip(*(columns[name] for name in names), strict=True)
    ]
    return sorted(specs, key=lambda s: s.arrival_s)


def simulate_trace(
    trace: Trace,
    spec: EngineSpec,
    time_scale: float = 1.0,
    progress: Callable[[int], None] | None = None,
    noise: StepNoise | None = None,
) -> VirtualRun:
    return run_virtual(EngineCore(spec, noise), trace_requests(trace, time_scale), progress=progress)


def _row(run: VirtualRun, timing: RequestTiming, arm: str, repeat: int) -> dict[str, object]:
    spec = timing.spec
    row: dict[str, object] = {
        "request_id": spec.request_id,
        "arm": arm,
        "repeat": repeat,
        "intended_s": spec.arrival_s,
        "sent_s": spec.arrival_s,
        "lag_s": 0.0,
        "expected_output_tokens": spec.output_tokens,
        "prompt_tokens": spec.prompt_tokens,
        "tenant": spec.tenant,
        "worker": 0,
    }
    if timing.rejected:
        return row | {"status": 400, "error": "http_4xx", "output_tokens": 0}
    times = [t - spec.arrival_s for t in run.token_times(timing)]
    tokens = sum(timing.token_counts)
    return row | {
        "status": 200,
        "ttft_s": times[0],
        "e2e_s": times[-1],
        "token_times": times,
        "token_counts": timing.token_counts,  # the engine's own count per step (several under speculation)
        "token_count_source": CONTINUOUS_USAGE,
        "output_tokens": tokens,
        "output_tokens_usage": tokens,
        "prompt_tokens_server": spec.prompt_tokens,
        "finish_reason": "length",
    }


def result_table(run: VirtualRun, arm: str, repeat: int) -> pa.Table:
    return results_table(_row(run, t, arm, repeat) for t in run.requests)


def write_simulated_results(
    out: str | os.PathLike[str],
    run: VirtualRun,
    spec: EngineSpec,
    trace_path: Path,
    arm: str,
    repeat: int,
    time_scale: float,
    noise: StepNoise | None = None,
) -> Path:
    span = max((t.spec.arrival_s for t in run.requests), default=0.0)
    gpus = f"{spec.tensor_parallel_size} x {spec.gpu.name}"
    metadata = {
        META_ARM: arm,
        META_REPEAT: str(repeat),
        META_COMPLETE: "true",
        META_SIMULATED: "true",
        META_URL: f"sim://{spec.policy.label}@{gpus}",
        META_TIME_SCALE: str(time_scale),
        META_OFFERED_RATE: f"{len(run.requests) / span:.6f}" if span > 0 else "0",
        META_TRACE_SOURCE: str(trace_path),
        META_SIM_POLICY: spec.policy.label,
        META_SIM_GPU: gpus,
        META_SIM_MODEL: spec.shape.name,
        META_SIM_PREEMPTIONS: str(run.preemptions),
        META_SIM_NOISE: json.dumps(noise.describe()) if noise is not None else "off",
        META_SIM_SPECULATION: spec.speculation.label if spec.speculation else "off",
    }
    return write_results(out, result_table(run, arm, repeat), metadata)
