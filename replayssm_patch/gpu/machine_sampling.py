"""What the machine did while an engine-side measurement ran: the harness's run telemetry, kept beside the row.

Why: on the H200 (2026-12-03) an engine under churn slowed 23 % from one repeat to the next, in both arms, and
nothing said whether the GPU's clock, the host or the engine's memory had changed. Every churn repeat and every
engine_step batch now samples the host's CPU and the engine's GPUs (SM clock against its maximum) once a second
(``harness.experiment.telemetry``) and keeps ``run_conditions``' figures in its row, with the engine process's
resident memory at its end.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import psutil

from harness.analysis.run_conditions import clock_share, run_conditions
from harness.experiment.telemetry import RunTelemetry


def visible_gpus() -> list[int]:
    """The physical GPUs this engine runs on, as nvidia-smi numbers them (CUDA_VISIBLE_DEVICES; unset: GPU 0)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")
    return [int(gpu) for gpu in listed if gpu.strip().isdigit()]


def telemetry_path(out: Path, run: str, batch: int, repeat: int | None = None) -> Path:
    """Where a measurement's samples go: ``<results file's stem>-telemetry/`` beside its results file ``out``, a file
    per run (what ran and in which mode, e.g. ``replayssm_fp32-default``) and batch (and repeat). Why a folder per
    results file: in session 33 the host-floor model's baseline rows (``engine_step-h100-floor.json``) overwrote the
    real model's baseline samples in a folder both shared."""
    name = f"{run}-b{batch}" + ("" if repeat is None else f"-r{repeat}")
    return out.parent / f"{out.stem}-telemetry" / f"{name}.json"


def sampling(path: Path) -> RunTelemetry:
    """Samples host and this engine's GPUs from entry to exit into ``path``."""
    return RunTelemetry(path, gpus=visible_gpus())


def engine_rss_mib() -> float | None:
    """Resident memory of this process's children (vLLM's engine core runs in one), in MiB; None without children.
    Read after each repeat: a figure that grows from repeat to repeat points the engine's drift at a leak."""
    total = 0
    children = psutil.Process().children(recursive=True)
    for child in children:
        try:
            total += child.memory_info().rss
        except psutil.Error:  # a child that ended meanwhile
            continue
    return round(total / 2**20, 1) if children else None


def host_probe_ms(rounds: int = 5) -> float:
    """The best of ``rounds`` timings of one fixed pure-Python workload, in ms: the host's single-thread speed now.
    Why: in session 24 one ReplaySSM spec engine waited for its host (the GPU idle 12.9 of 32.5 ms a profiled step,
    its CUDA calls ~1.7x slower than in the next engine on that host) while CPU share, load and steal looked the
    same; a step near vLLM's host work follows the host's speed, so rows compared across engines need it."""
    best = math.inf
    for _ in range(rounds):
        began = time.perf_counter()
        sum(i * i for i in range(200_000))
        best = min(best, time.perf_counter() - began)
    return round(best * 1e3, 3)


def sampled_conditions(path: Path) -> dict[str, Any] | None:
    """The samples at ``path`` as a row keeps them (run_conditions' figures, the SM clock as a share of its
    maximum, the engine's resident memory and the host's probe time now), or None when nothing was written."""
    conditions = run_conditions(path)
    if conditions is None:
        return None
    share = clock_share(conditions)
    return conditions.model_dump() | {
        "gpu_clock_share": None if share is None else round(share, 3),
        "engine_rss_mib": engine_rss_mib(),
        "host_probe_ms": host_probe_ms(),
    }
