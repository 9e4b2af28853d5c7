"""One run's telemetry file (experiment/telemetry.py) reduced to the few figures the report shows beside the run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from harness.analysis.model import RunConditions


def _stat(samples: list[dict], key: str, how: str, digits: int = 2) -> float | None:
    values = np.array([s[key] for s in samples if isinstance(s.get(key), int | float)], float)
    values = values[np.isfinite(values)]
    if not values.size:
        return None
    return round(float({"mean": np.mean, "min": np.min, "max": np.max}[how](values)), digits)


def run_conditions(path: Path) -> RunConditions | None:
    """The run's conditions, or None when it has no readable telemetry file (run directories from before it)."""
    try:
        payload = json.loads(path.read_text())
        host, gpu, server = list(payload["host"]), list(payload["gpu"]), list(payload.get("server", []))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return RunConditions(
        samples=len(host),
        cpu_busy_mean_pct=_stat(host, "cpu_busy_pct", "mean"),
        cpu_steal_max_pct=_stat(host, "cpu_steal_pct", "max"),
        load1_max=_stat(host, "load1", "max"),
        gpu_sm_mhz_mean=_stat(gpu, "sm_mhz", "mean"),
        gpu_sm_mhz_min=_stat(gpu, "sm_mhz", "min"),
        gpu_max_sm_mhz=_stat(gpu, "max_sm_mhz", "max"),
        gpu_power_w_mean=_stat(gpu, "power_w", "mean"),
        gpu_temperature_c_max=_stat(gpu, "temperature_c", "max"),
        gpu_utilization_mean_pct=_stat(gpu, "utilization_pct", "mean"),
        gpu_mem_mhz_min=_stat(gpu, "mem_mhz", "min"),
        gpu_memory_temperature_c_max=_stat(gpu, "memory_temperature_c", "max"),
        gpu_error=payload.get("gpu_error"),
        server_running_mean=_stat(server, "running", "mean"),
        server_waiting_mean=_stat(server, "waiting", "mean"),
        server_waiting_max=_stat(server, "waiting", "max"),
        server_samples=len(server),
        server_kv_usage_max=_stat(server, "kv_usage", "max", digits=4),  # a fraction: 4 digits keep 0.01 %
        server_error=None if server else payload.get("server_error"),
    )


def clock_share(conditions: RunConditions) -> float | None:
    """The run's mean SM clock as a share of the GPUs' maximum (below ~0.9 under load: throttled), or None."""
    mean, top = conditions.gpu_sm_mhz_mean, conditions.gpu_max_sm_mhz
    return mean / top if mean is not None and top else None  # _stat keeps only finite samples
