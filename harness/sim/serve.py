"""Start the simulated engine's HTTP server and run it until SIGINT/SIGTERM; every log line says SIMULATED."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import os
import signal
from dataclasses import dataclass, field

from harness.errors import UserError
from harness.sim.engine_core import EngineCore
from harness.sim.engine_spec import EngineSpec
from harness.sim.faults import FaultConfig, FaultInjector
from harness.sim.metrics import EngineMetrics
from harness.sim.noise import StepNoise
from harness.sim.realtime import RealtimeEngine
from harness.sim.server import ServerState, build_app

GIB = 1 << 30


@dataclass(frozen=True)
class ServeOptions:
    spec: EngineSpec
    host: str = "127.0.0.1"
    port: int = 8000
    seed: int = 0
    model_name: str = "sim"
    faults: FaultConfig = field(default_factory=FaultConfig)
    noise: StepNoise | None = None


def log(message: str) -> None:
    print(f"SIMULATED ENGINE: {message}", flush=True)


def describe(core: EngineCore) -> list[str]:
    """The start-up banner: what is being simulated and with which memory budget."""
    spec, shape = core.spec, core.spec.shape
    rec = shape.recurrent
    return [
        "replaybench serve-sim - timings come from a calibrated cost model, NOT a GPU",
        f"model {shape.name}: {shape.total_params / 1e9:.2f}B params ({shape.active_params_per_token / 1e9:.2f}B "
        f"active), {shape.attention.layers} attention + {rec.layers if rec else 0} {rec.kind if rec else ''} layers",
        f"gpu {spec.tensor_parallel_size} x {spec.gpu.name} (simulated); policy {spec.policy.label}; state "
        f"{spec.policy.memory_bytes_per_seq(rec, spec.spec_tokens) / (1 << 20):.1f} MiB/seq; "
        f"KV {shape.kv_bytes_per_token} B/token",
        "speculative decoding: " + (f"{spec.speculation.label} (synthetic acceptance)" if spec.speculation else "off"),
        f"memory pool {core.pool.capacity_bytes / GIB:.2f} GiB; max-num-seqs {spec.limits.max_num_seqs}; "
        f"max-num-batched-tokens {spec.limits.max_num_batched_tokens}; max-model-len {spec.max_model_len}; "
        f"{core.max_concurrent_sequences} full-length sequences fit",
    ]


def serve(options: ServeOptions) -> None:
    asyncio.run(_serve(options))


async def _serve(options: ServeOptions) -> None:
    from aiohttp import web

    core = EngineCore(options.spec, options.noise)
    metrics = EngineMetrics(model_name=options.model_name, spec_tokens=options.spec.spec_tokens)
    engine = RealtimeEngine(core, metrics)
    faults = FaultInjector(options.faults, options.seed)
    state = ServerState(
        engine=engine,
        metrics=metrics,
        faults=faults,
        model_name=options.model_name,
        seed=options.seed,
        ids=itertools.count(),
    )
    for line in describe(core):
        log(line)
    log(f"fault injection: {options.faults.describe()}")
    log(f"step-time noise: {options.noise.label() if options.noise else 'off'}")
    # a GPU the launcher placed this server on is only a label here, logged so placement can be checked
    log(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')} (no GPU is used)")
    runner = web.AppRunner(build_app(state), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, options.host, options.port, backlog=1024).start()
    except OSError as exc:
        await runner.cleanup()
        raise UserError(
            f"cannot listen on {options.host}:{options.port} ({exc.strerror}); choose a free --port"
        ) from None
    port = runner.addresses[0][1]
    log(f"listening on http://{options.host}:{port} (port {port}); served model name {options.model_name!r}")
    loop = asyncio.get_running_loop()
    if options.faults.startup_delay_s:
        loop.call_later(options.faults.startup_delay_s, log, "ready (startup delay over)")
    else:
        log("ready")
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    gc.collect()
    gc.freeze()  # start-up objects never need scanning again: shorter collector pauses inside the step loop
    engine_task = asyncio.create_task(engine.run())
    await stop.wait()
    engine_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await engine_task
    await runner.cleanup()
    lat, lag = metrics.lateness, metrics.delivery
    log(
        f"stopped after {metrics.step_duration.count} steps; step lateness p50 {lat.quantile(0.5) * 1e3:.3f} ms, "
        f"p99 {lat.quantile(0.99) * 1e3:.3f} ms, max {lat.max_s * 1e3:.3f} ms; token delivery lag p99 "
        f"{lag.quantile(0.99) * 1e3:.3f} ms"
    )
