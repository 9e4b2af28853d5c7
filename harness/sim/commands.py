"""CLI commands of the simulated engine: `serve-sim`, `simulate`, `sim-calibrate` (heavy imports stay inside)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from harness.errors import UserError
from harness.sim.noise import NO_NOISE, NoiseModel, step_noise
from harness.trace.slice_options import DurationOption, LimitOption, StartOption, slice_if_asked

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "configs" / "models" / "nemotron-h-8b.json"

ModelConfig = Annotated[
    Path | None,
    typer.Option(
        "--model-config",
        help="model: a name in configs/models/ (nemotron-h-8b, qwen3.5-4b, qwen3.5-35b-a3b, ...), an HF-style "
        "config.json or a model directory [nemotron-h-8b]",
    ),
]
GpuName = Annotated[str, typer.Option("--gpu", help="h200, h100, a100, l40s or rtx4090")]
Policy = Annotated[str, typer.Option("--policy", help="baseline or replayssm")]
SsmDtype = Annotated[str, typer.Option("--ssm-dtype", help="SSM state dtype: float32 or bfloat16")]
BufferLen = Annotated[int, typer.Option("--buffer-len", help="ReplaySSM ring length L (flush every L steps)")]
SplitPrecision = Annotated[bool, typer.Option("--split-precision", help="ReplaySSM: fp32 master + bf16 copy")]
MaxNumSeqs = Annotated[int, typer.Option("--max-num-seqs", help="running-sequence cap")]
MaxBatchedTokens = Annotated[int, typer.Option("--max-num-batched-tokens", help="token budget per step")]
MaxModelLen = Annotated[int | None, typer.Option("--max-model-len", help="context limit [config's]")]
Calibration = Annotated[Path | None, typer.Option("--calibration", help="fitted factors JSON [H200 fit]")]
TensorParallel = Annotated[int, typer.Option("--tensor-parallel-size", help="GPUs the model is split over")]
SpecTokens = Annotated[
    int, typer.Option("--spec-tokens", help="speculative decoding: drafts k verified per decode step [0: off]")
]
AcceptanceLength = Annotated[
    float | None,
    typer.Option(
        "--acceptance-length",
        help="speculative decoding: synthetic mean tokens per verify step incl. the bonus token, in [1, k+1] [k+1]",
    ),
]
NoiseSwitch = Annotated[bool, typer.Option("--noise/--no-noise", help="calibrated step-time noise (sim/noise.py)")]
NoiseShared = Annotated[float, typer.Option("--noise-shared", help="noise: sd of the per-repeat factor of both arms")]
NoiseRun = Annotated[float, typer.Option("--noise-run", help="noise: sd of the per-run factor")]
NoiseStep = Annotated[float, typer.Option("--noise-step", help="noise: sd of the AR(1) per-step jitter")]
NoisePhi = Annotated[float, typer.Option("--noise-phi", help="noise: AR(1) coefficient of the step jitter")]
FIT = NoiseModel()  # the defaults: fitted to the H200 A/A


def noise_model(enabled: bool, shared: float, run: float, step: float, phi: float) -> NoiseModel:
    """The step-time noise the options ask for (all zero when `--no-noise`)."""
    return NoiseModel(shared, run, step, phi) if enabled else NO_NOISE


def _spec(
    model_config: Path | None,
    gpu: str,
    policy: str,
    ssm_dtype: str,
    buffer_len: int,
    split_precision: bool,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    max_model_len: int | None,
    calibration: Path | None,
    tensor_parallel_size: int,
    spec_tokens: int = 0,
    acceptance_length: float | None = None,
):
    from harness.sim.engine_spec import build_spec
    from harness.sim.speculation import speculation_of
    from harness.sim.state_policy import StatePolicy

    state_policy = StatePolicy(policy, ssm_dtype, buffer_len, split_precision)  # type: ignore[arg-type]
    return build_spec(
        model_config or DEFAULT_MODEL,
        gpu,
        state_policy,
        max_num_seqs,
        max_num_batched_tokens,
        max_model_len,
        calibration,
        tensor_parallel_size,
        speculation_of(spec_tokens, acceptance_length),
    )


def spec_from_serve_args(args: list[str], cwd: Path):
    """The engine a `serve-sim ARGS` command line would run, parsed by serve-sim's own options.

    Relative `--model-config` / `--calibration` paths are taken against `cwd`, the server's working directory;
    a bare `--model-config` name means a shipped config.
    """
    from harness.sim.model_config import resolve_model_config

    app = typer.Typer(add_completion=False)
    app.command()(serve_sim)
    try:
        params = typer.main.get_command(app).make_context("serve-sim", list(args)).params
    except typer.TyperException as error:  # typer's (vendored click) usage errors
        raise UserError(f"serve-sim {' '.join(args)}: {error.format_message()}; fix the command") from None

    def path(value: Path | None) -> Path | None:
        return value if value is None or value.is_absolute() else cwd / value

    model = params["model_config"]
    return _spec(
        model and resolve_model_config(model, cwd),
        params["gpu"],
        params["policy"],
        params["ssm_dtype"],
        params["buffer_len"],
        params["split_precision"],
        params["max_num_seqs"],
        params["max_num_batched_tokens"],
        params["max_model_len"],
        path(params["calibration"]),
        params["tensor_parallel_size"],
        params["spec_tokens"],
        params["acceptance_length"],
    )


def serve_sim(
    port: Annotated[int, typer.Option("--port", help="TCP port; 0 picks a free one and logs it")],
    model_config: ModelConfig = None,
    gpu: GpuName = "h200",
    policy: Policy = "baseline",
    ssm_dtype: SsmDtype = "float32",
    buffer_len: BufferLen = 16,
    split_precision: SplitPrecision = False,
    max_num_seqs: MaxNumSeqs = 256,
    max_num_batched_tokens: MaxBatchedTokens = 8192,
    max_model_len: MaxModelLen = None,
    calibration: Calibration = None,
    tensor_parallel_size: TensorParallel = 1,
    spec_tokens: SpecTokens = 0,
    acceptance_length: AcceptanceLength = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    seed: Annotated[int, typer.Option("--seed", help="seed of the generated text and of injected faults")] = 0,
    served_model_name: Annotated[str | None, typer.Option("--served-model-name", help="[config file stem]")] = None,
    fail_rate: Annotated[float, typer.Option("--fail-rate", help="fraction of requests answered HTTP 500")] = 0.0,
    stall_after_tokens: Annotated[
        int | None, typer.Option("--stall-after-tokens", help="streams stop after N tokens")
    ] = None,
    crash_after_requests: Annotated[
        int | None, typer.Option("--crash-after-requests", help="exit hard when request N+1 arrives")
    ] = None,
    startup_delay: Annotated[float, typer.Option("--startup-delay", help="seconds of 503 before ready")] = 0.0,
    noise: NoiseSwitch = False,
    noise_shared: NoiseShared = FIT.shared_sd,
    noise_run: NoiseRun = FIT.run_sd,
    noise_step: NoiseStep = FIT.step_sd,
    noise_phi: NoisePhi = FIT.step_phi,
    noise_repeat: Annotated[
        int, typer.Option("--noise-repeat", envvar="REPLAYBENCH_REPEAT", help="repeat the shared noise factor is for")
    ] = 0,
    noise_arm: Annotated[
        str, typer.Option("--noise-arm", envvar="REPLAYBENCH_ARM", help="arm name the per-run noise is seeded by")
    ] = "serve-sim",
) -> None:
    """Serve the OpenAI API from the SIMULATED engine (calibrated cost model; no GPU needed).

    `replaybench run` tells every server it launches its arm and repeat (REPLAYBENCH_ARM, REPLAYBENCH_REPEAT), so
    with `--noise` both arms of a repeat share its per-repeat factor when they are started fresh per repeat."""
    from harness.sim.faults import FaultConfig
    from harness.sim.serve import ServeOptions, serve

    if not 0 <= port <= 65535:
        raise UserError(f"--port must be 0-65535 (got {port}); 0 picks a free port and logs it")
    spec = _spec(
        model_config,
        gpu,
        policy,
        ssm_dtype,
        buffer_len,
        split_precision,
        max_num_seqs,
        max_num_batched_tokens,
        max_model_len,
        calibration,
        tensor_parallel_size,
        spec_tokens,
        acceptance_length,
    )
    faults = FaultConfig(fail_rate, stall_after_tokens, crash_after_requests, startup_delay)
    model = noise_model(noise, noise_shared, noise_run, noise_step, noise_phi)
    steps = step_noise(model, seed, noise_repeat, noise_arm)
    serve(
        ServeOptions(
            spec=spec,
            host=host,
            port=port,
            seed=seed,
            model_name=served_model_name or spec.shape.name,
            faults=faults,
            noise=steps,
        )
    )


def simulate(
    trace: Annotated[Path, typer.Argument(help="trace .parquet")],
    output: Annotated[Path, typer.Option("-o", "--output", help="result .parquet to write")],
    model_config: ModelConfig = None,
    gpu: GpuName = "h200",
    policy: Policy = "baseline",
    ssm_dtype: SsmDtype = "float32",
    buffer_len: BufferLen = 16,
    split_precision: SplitPrecision = False,
    max_num_seqs: MaxNumSeqs = 256,
    max_num_batched_tokens: MaxBatchedTokens = 8192,
    max_model_len: MaxModelLen = None,
    calibration: Calibration = None,
    tensor_parallel_size: TensorParallel = 1,
    spec_tokens: SpecTokens = 0,
    acceptance_length: AcceptanceLength = None,
    time_scale: Annotated[float, typer.Option("--time-scale", help="<1 compresses the trace (0.5 = 2x rate)")] = 1.0,
    arm: Annotated[str | None, typer.Option("--arm", help="arm name in the result [policy label]")] = None,
    repeat: Annotated[int, typer.Option("--repeat", help="repeat number stored in the results")] = 0,
    start: StartOption = 0.0,
    duration: DurationOption = None,
    limit: LimitOption = None,
    noise: NoiseSwitch = True,
    noise_shared: NoiseShared = FIT.shared_sd,
    noise_run: NoiseRun = FIT.run_sd,
    noise_step: NoiseStep = FIT.step_sd,
    noise_phi: NoisePhi = FIT.step_phi,
    seed: Annotated[int, typer.Option("--seed", help="noise seed; with --repeat and --arm it fixes every draw")] = 0,
    step_scale: Annotated[
        float, typer.Option("--step-scale", help="what-if: every step time x this (0.9 = a 10% faster step)")
    ] = 1.0,
) -> None:
    """Run a trace through the SIMULATED engine in virtual time and write a (simulated) result file.

    Step times carry calibrated noise unless `--no-noise`: the per-repeat factor is drawn from (seed, repeat), so
    two arms simulated with the same --seed and --repeat share it; the rest also depends on --arm."""
    from rich.console import Console
    from rich.progress import Progress

    from harness.sim.simulate import simulate_trace, write_simulated_results
    from harness.sim.summary import summarise
    from harness.trace.model import Trace

    if time_scale <= 0:
        raise UserError(f"--time-scale must be > 0 (got {time_scale}); use 0.5 to double the rate")
    spec = _spec(
        model_config,
        gpu,
        policy,
        ssm_dtype,
        buffer_len,
        split_precision,
        max_num_seqs,
        max_num_batched_tokens,
        max_model_len,
        calibration,
        tensor_parallel_size,
        spec_tokens,
        acceptance_length,
    )
    arm_name = arm or spec.policy.label
    model = noise_model(noise, noise_shared, noise_run, noise_step, noise_phi)
    steps = step_noise(model, seed, repeat, arm_name, step_scale)
    loaded = slice_if_asked(Trace.read(trace), start, duration, limit)
    started = time.perf_counter()
    with Progress(transient=True) as bar:
        task = bar.add_task("simulating (virtual time)", total=len(loaded))
        run = simulate_trace(loaded, spec, time_scale, progress=lambda n: bar.advance(task, n), noise=steps)
    elapsed = time.perf_counter() - started
    path = write_simulated_results(output, run, spec, trace, arm_name, repeat, time_scale, steps)
    Console().print(summarise(run, spec, arm_name, path, elapsed, steps))


def sim_calibrate(
    calibration_file: Annotated[Path, typer.Argument(help="measured calibration JSON (configs/calibration/)")],
    output: Annotated[Path, typer.Option("-o", "--output", help="fitted factors JSON to write")],
    model_config: ModelConfig = None,
    gpu: GpuName = "h200",
) -> None:
    """Fit the SIMULATED engine's cost-model factors to measured vLLM runs and show the reproduction."""
    from rich.console import Console
    from rich.table import Table

    from harness.sim.calibration import fit_factors, read_calibration, reproduce, write_fit
    from harness.sim.gpus import get_gpu
    from harness.sim.model_config import load_model_shape

    cal = read_calibration(calibration_file)
    model_config = model_config or DEFAULT_MODEL
    shape, device = load_model_shape(model_config), get_gpu(gpu)
    factors = fit_factors(cal, shape, device)
    rows = reproduce(cal, shape, device, factors)
    write_fit(
        output, factors, rows, {"calibration": str(calibration_file), "model_config": str(model_config), "gpu": gpu}
    )
    table = Table(title=f"simulated vs measured decode ITL p50 ({output})")
    for column in ("state", "C", "measured ms", "modelled ms", "error"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            r.ssm_dtype,
            str(r.concurrency),
            f"{r.measured.itl_p50_ms:.2f}",
            f"{r.modelled.itl_p50_ms:.2f}",
            f"{100 * r.itl_p50_error:+.1f}%",
        )
    Console().print(table)
    Console().print(", ".join(f"{k}={v:.4g}" for k, v in factors.to_json().items()))


def register(app: typer.Typer) -> None:
    app.command("serve-sim")(serve_sim)
    app.command("simulate")(simulate)
    app.command("sim-calibrate")(sim_calibrate)
