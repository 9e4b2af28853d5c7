"""Simulated A/A repeats for planning: how noisy is the target metric at this load, before any GPU time is spent.

The baseline is simulated in virtual time on the configured trace slice: first its capacity under the `[slo]`
(noise-free bisection, as `replaybench capacity` does on real servers), then `pairs` A/A repeats with the
calibrated step-time noise at a share of that capacity. Both arms of a repeat share its per-repeat noise
factor, as they would on one host. The paired sd of the target's log-ratio is what `replaybench plan` turns
into repeats needed; the numbers describe the simulated engine, so they are planning, not evidence.

Scoring a result file belongs to analysis, which this layer does not import: the CLI scores the files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UserError
from harness.experiment.capacity import Capacity, Probe, ProbeRun, SearchBounds, find_capacity, judge_probe
from harness.experiment.check import model_config_path
from harness.experiment.config import ArmConfig, substitute
from harness.experiment.settings_diff import embedded_engine_args, parse_command
from harness.sim.engine_spec import EngineSpec, build_spec
from harness.sim.noise import NO_NOISE, NoiseModel, step_noise
from harness.sim.simulate import simulate_trace, write_simulated_results
from harness.sim.state_policy import StatePolicy
from harness.trace.model import Trace

# Virtual time is cheap, so the simulated capacity is bracketed widely and tightly.
SIM_BOUNDS = SearchBounds(min_scale=0.001, max_scale=4.0, tolerance=0.02)
VLLM_FLAGS = ("--max-num-seqs", "--max-num-batched-tokens", "--max-model-len", "--tensor-parallel-size")


def simulated_baseline(arm: ArmConfig, default_model: Path, gpu: str) -> tuple[EngineSpec, str]:
    """The engine that stands for the baseline, and a line saying which.

    An embedded-engine baseline is simulated exactly as its command says; any other server (vLLM) by the
    simulated engine with the model config and scheduler flags its command names, on `gpu`.
    """
    from harness.sim.commands import spec_from_serve_args

    argv = list(substitute(arm.command or [], arm.port))
    args = embedded_engine_args(argv)
    cwd = arm.cwd or Path.cwd()
    if args is not None:
        spec = spec_from_serve_args(args, cwd)
        return spec, f"the baseline's own embedded engine ({spec.policy.label}, {spec.gpu.name}, {_limits(spec)})"
    flags = parse_command(argv)
    try:
        limits = {flag: int(flags[flag] or "") for flag in VLLM_FLAGS if flag in flags}
    except ValueError:
        raise UserError(f"arms.baseline.command: one of {', '.join(VLLM_FLAGS)} is not a whole number") from None
    dtype = "float32" if flags.get("--mamba-ssm-cache-dtype") == "float32" else "bfloat16"
    model = model_config_path(arm) or default_model
    spec = build_spec(
        model,
        gpu,
        StatePolicy("baseline", dtype, 16, False),  # type: ignore[arg-type]
        max_num_seqs=limits.get("--max-num-seqs", 256),
        max_num_batched_tokens=limits.get("--max-num-batched-tokens", 8192),
        max_model_len=limits.get("--max-model-len"),
        tensor_parallel_size=limits.get("--tensor-parallel-size", 1),
    )
    server = " ".join(argv[:3]) or "the server"
    return spec, f"the simulated engine standing in for `{server}` ({model.name} on {gpu}, {_limits(spec)})"


def _limits(spec: EngineSpec) -> str:
    return f"max-model-len {spec.max_model_len}, max-num-seqs {spec.limits.max_num_seqs}"


@dataclass(frozen=True)
class SimulatedSetup:
    """What every simulated run shares: the trace slice, the engine, and where result files go."""

    trace: Trace
    spec: EngineSpec
    workdir: Path

    def run(
        self, time_scale: float, noise: NoiseModel, seed: int, repeat: int, arm: str, step_scale: float = 1.0
    ) -> Path:
        """One virtual-time run of the baseline engine (its steps x `step_scale`), written as a repeat's result."""
        steps = step_noise(noise, seed, repeat, arm, step_scale)
        result = simulate_trace(self.trace, self.spec, time_scale, noise=steps)
        path = self.workdir / f"{arm}-r{repeat}-s{time_scale:.6f}-x{step_scale:g}.parquet"
        write_simulated_results(path, result, self.spec, Path("plan"), arm, repeat, time_scale, steps)
        return path


def simulated_capacity(setup: SimulatedSetup, attainment: Callable[[Path], float], target: float) -> float:
    """The time scale at which the noise-free simulated baseline still attains its SLO target."""

    def probe(time_scale: float) -> Probe:
        attained = attainment(setup.run(time_scale, NO_NOISE, 0, 0, "capacity"))
        return judge_probe(time_scale, (ProbeRun(0, True, attained, None),), target)

    found: Capacity = find_capacity(probe, SIM_BOUNDS)
    if found.limit == "at_least":
        raise UserError(
            f"the simulated baseline holds the SLO even at {1 / SIM_BOUNDS.min_scale:.0f}x compression: the slice "
            "is too small to load it; give a longer slice ([trace] duration_s / limit)"
        )
    if found.passing is None:
        raise UserError(
            f"the simulated baseline misses the SLO target even at time scale {SIM_BOUNDS.max_scale:g}; "
            "relax [slo] or check the slice (requests longer than --max-model-len count as misses)"
        )
    return found.passing.time_scale


def aa_repeats(
    setup: SimulatedSetup, time_scale: float, noise: NoiseModel, seed: int, pairs: int
) -> list[tuple[Path, Path]]:
    """The (baseline, candidate) result files of `pairs` simulated A/A repeats; both arms of a repeat share
    its per-repeat noise factor."""
    return [
        (
            setup.run(time_scale, noise, seed, repeat, "baseline"),
            setup.run(time_scale, noise, seed, repeat, "candidate"),
        )
        for repeat in range(pairs)
    ]
