"""Fit the cost model's efficiency factors to a measured calibration file, and check the fit.

The calibration load is closed loop (C streams, 2C requests, prompt 1024, output 256), so we replay exactly
that load through the simulated scheduler in virtual time. In a closed loop a finished request's successor
is ready for the very next step, so *which* steps run (their batch composition) does not depend on how long
they take; only their durations do. The fit therefore simulates each load once, keeps every step's
peak-rate features and every inter-token gap's (from-step, to-step) pair, and then solves for the factors
that make the modelled ITL p50 (weight 1) and p99 (weight 0.3) match the measurements in log space.
The memory reserve comes from the server log's available KV-cache size.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from harness.atomic import atomic_path
from harness.errors import UserError
from harness.sim.cost_model import FittedFactors
from harness.sim.engine_core import EngineCore
from harness.sim.engine_spec import EngineSpec
from harness.sim.gpus import Gpu
from harness.sim.model_config import ModelShape
from harness.sim.scheduler import SchedulerLimits
from harness.sim.state_policy import StatePolicy
from harness.sim.virtual import ClosedLoop, VirtualRun, run_virtual

GIB = 1 << 30
DTYPE_KEYS = {"float32": "ssm_cache_float32", "bfloat16": "ssm_cache_bfloat16"}
P99_WEIGHT = 0.3


@dataclass(frozen=True)
class LoadMetrics:
    """The calibration file's columns for one load: decode ITL, TTFT, and output throughput."""

    itl_p50_ms: float
    itl_p99_ms: float
    ttft_p50_s: float
    output_tokens_per_s: float


@dataclass(frozen=True)
class CalibrationPoint:
    ssm_dtype: str
    concurrency: int
    measured: LoadMetrics


@dataclass(frozen=True)
class Calibration:
    points: list[CalibrationPoint]
    available_kv_bytes: int
    prompt_tokens: int = 1024
    output_tokens: int = 256
    max_num_seqs: int = 256
    max_model_len: int = 4096


def read_calibration(path: str | os.PathLike[str]) -> Calibration:
    path = Path(path)
    try:
        payload = json.loads(path.read_text())
        points = []
        for dtype, key in DTYPE_KEYS.items():
            column = {name: i for i, name in enumerate(payload["columns"])}
            for row in payload[key]:
                points.append(
                    CalibrationPoint(
                        dtype,
                        int(row[column["concurrency"]]),
                        LoadMetrics(
                            row[column["itl_p50_ms"]],
                            row[column["itl_p99_ms"]],
                            row[column["ttft_p50_s"]],
                            row[column["output_tokens_per_s"]],
                        ),
                    )
                )
        available = int(payload["server_log_facts"]["available_kv_cache_gib"] * GIB)
    except FileNotFoundError:
        raise UserError(
            f"{path}: no such calibration file; give e.g. configs/calibration/h200-vllm-0.24.0-nemotron-h-8b.json"
        ) from None
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise UserError(f"{path}: not a calibration file in the expected layout ({exc!r})") from None
    return Calibration(points=points, available_kv_bytes=available)


def calibration_spec(cal: Calibration, shape: ModelShape, gpu: Gpu, dtype: str, factors: FittedFactors) -> EngineSpec:
    """The engine the calibration measured: baseline policy, vLLM's default 8192-token budget."""
    return EngineSpec(
        shape=shape,
        gpu=gpu,
        policy=StatePolicy("baseline", dtype),
        factors=factors,
        limits=SchedulerLimits(max_num_seqs=cal.max_num_seqs),
        max_model_len=cal.max_model_len,
    )


def closed_loop_run(spec: EngineSpec, concurrency: int, prompt_tokens: int, output_tokens: int) -> VirtualRun:
    loop = ClosedLoop(concurrency, max(2 * concurrency, 8), prompt_tokens, output_tokens)
    return run_virtual(EngineCore(spec), [], closed_loop=loop)


def load_metrics(run: VirtualRun) -> LoadMetrics:
    """ITL over every consecutive token pair, TTFT from arrival, throughput over the whole run."""
    gaps: list[float] = []
    ttfts: list[float] = []
    last = 0.0
    tokens = 0
    for timing in run.requests:
        times = run.token_times(timing)
        if not times:
            continue
        ttfts.append(times[0] - timing.spec.arrival_s)
        gaps.extend(np.diff(times))
        last, tokens = max(last, times[-1]), tokens + len(times)
    return LoadMetrics(
        itl_p50_ms=float(np.percentile(gaps, 50)) * 1e3 if gaps else 0.0,
        itl_p99_ms=float(np.percentile(gaps, 99)) * 1e3 if gaps else 0.0,
        ttft_p50_s=float(np.median(ttfts)) if ttfts else 0.0,
        output_tokens_per_s=tokens / last if last else 0.0,
    )


@dataclass(frozen=True)
class _FitCase:
    """One load, reduced to arrays: per-step peak-rate features and each gap's (from, to) step index."""

    point: CalibrationPoint
    features: np.ndarray  # (steps, 4): weights_s, flops_s, traffic_s, seqs
    gap_from: np.ndarray
    gap_to: np.ndarray

    def itl_quantiles_ms(self, factors: FittedFactors) -> tuple[float, float]:
        f = self.features
        ends = np.cumsum(factors.combine(f[:, 0], f[:, 1], f[:, 2], f[:, 3]))
        gaps = ends[self.gap_to] - ends[self.gap_from]
        return float(np.percentile(gaps, 50)) * 1e3, float(np.percentile(gaps, 99)) * 1e3


def _fit_case(cal: Calibration, shape: ModelShape, gpu: Gpu, point: CalibrationPoint) -> _FitCase:
    spec = calibration_spec(cal, shape, gpu, point.ssm_dtype, FittedFactors())
    run = closed_loop_run(spec, point.concurrency, cal.prompt_tokens, cal.output_tokens)
    cost = spec.cost_model()
    feats = [cost.features(w) for w in run.step_works]
    features = np.array([[f.weights_s, f.flops_s, f.traffic_s, f.seqs] for f in feats])
    pairs = [(a, b) for t in run.requests for a, b in zip(t.token_steps, t.token_steps[1:], strict=False)]
    return _FitCase(point, features, np.array([a for a, _ in pairs]), np.array([b for _, b in pairs]))


PARAMS = ("overhead_s", "per_seq_s", "weight_bw_eff", "traffic_bw_eff", "flop_eff")
LOWER = (0.0, 0.0, 0.05, 0.05, 0.05)
UPPER = (0.02, 2e-4, 1.0, 1.0, 1.0)


def fit_factors(cal: Calibration, shape: ModelShape, gpu: Gpu) -> FittedFactors:
    """Least-squares fit of the five factors to ITL p50 (and, more weakly, p99) of every calibration point."""
    from scipy.optimize import least_squares

    reserve = max(int(gpu.memory_bytes * 0.85) - shape.weight_bytes - cal.available_kv_bytes, 0)
    cases = [_fit_case(cal, shape, gpu, p) for p in cal.points]

    def residuals(x: np.ndarray) -> np.ndarray:
        factors = FittedFactors(**dict(zip(PARAMS, x, strict=True)))
        out = []
        for case in cases:
            p50, p99 = case.itl_quantiles_ms(factors)
            out += [
                np.log(p50 / case.point.measured.itl_p50_ms),
                P99_WEIGHT * np.log(p99 / case.point.measured.itl_p99_ms),
            ]
        return np.array(out)

    start = FittedFactors()
    x0 = np.array([getattr(start, name) for name in PARAMS])
    solution = least_squares(residuals, x0, bounds=(LOWER, UPPER), x_scale=x0)
    values = {name: float(v) for name, v in zip(PARAMS, solution.x, strict=True)}
    return FittedFactors(**values, memory_reserve_bytes=reserve)


@dataclass(frozen=True)
class ReproductionRow:
    ssm_dtype: str
    concurrency: int
    measured: LoadMetrics
    modelled: LoadMetrics

    @property
    def itl_p50_error(self) -> float:
        return self.modelled.itl_p50_ms / self.measured.itl_p50_ms - 1.0


def reproduce(cal: Calibration, shape: ModelShape, gpu: Gpu, factors: FittedFactors) -> list[ReproductionRow]:
    """Run every calibration load through the full virtual engine with `factors` and compare."""
    rows = []
    for point in cal.points:
        spec = calibration_spec(cal, shape, gpu, point.ssm_dtype, factors)
        run = closed_loop_run(spec, point.concurrency, cal.prompt_tokens, cal.output_tokens)
        rows.append(ReproductionRow(point.ssm_dtype, point.concurrency, point.measured, load_metrics(run)))
    return rows


def write_fit(
    out: str | os.PathLike[str], factors: FittedFactors, rows: list[ReproductionRow], sources: dict[str, str]
) -> Path:
    payload = {
        "what": "cost-model factors of replaybench's SIMULATED engine, fitted by `replaybench sim-calibrate`",
        "fitted_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "sources": sources,
        "method": (__doc__ or "").strip(),
        "factors": factors.to_json(),
        "reproduction": [
            {
                "ssm_dtype": r.ssm_dtype,
                "concurrency": r.concurrency,
                "measured": asdict(r.measured),
                "modelled": {k: round(v, 4) for k, v in asdict(r.modelled).items()},
                "itl_p50_error_pct": round(100 * r.itl_p50_error, 2),
            }
            for r in rows
        ],
    }
    out = Path(out)
    with atomic_path(out) as tmp:
        tmp.write_text(json.dumps(payload, indent=1) + "\n")
    return out
