"""Per replay worker: how late its event loop ran (receive lag) and how much of a core it used.

Replay measures these (harness/replay/loop_probe.py) and stores them in the result file's metadata under
META_WORKER_LOADS as JSON, one object per worker, so analysis can re-judge a run's receive-side fidelity
from the file alone. A file written before the measurement existed has no such key: receive lag unknown.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from harness.records.result_schema import META_WORKER_LOADS


@dataclass(frozen=True)
class WorkerLoad:
    """One worker's loop lateness quantiles (None without samples) and CPU share (CPU time / wall time)."""

    worker: int
    samples: int
    receive_lag_p50_s: float | None
    receive_lag_p99_s: float | None
    receive_lag_max_s: float | None
    cpu_share: float | None


def worker_load(worker: int, lateness_s: np.ndarray, cpu_s: float, wall_s: float) -> WorkerLoad:
    """Quantiles of a worker's lateness samples (seconds) and its CPU share over the same wall time."""
    lateness_s = np.asarray(lateness_s, dtype=float)
    p50, p99, top = (float(v) for v in np.quantile(lateness_s, [0.5, 0.99, 1.0])) if len(lateness_s) else (None,) * 3
    return WorkerLoad(
        worker=worker,
        samples=len(lateness_s),
        receive_lag_p50_s=p50,
        receive_lag_p99_s=p99,
        receive_lag_max_s=top,
        cpu_share=cpu_s / wall_s if wall_s > 0 else None,
    )


def loads_to_meta(loads: Sequence[WorkerLoad]) -> dict[str, str]:
    return {META_WORKER_LOADS: json.dumps([asdict(load) for load in loads])}


def loads_from_meta(meta: Mapping[str, str]) -> tuple[WorkerLoad, ...] | None:
    """The worker loads a result file carries; None when it carries none (written before they were measured)."""
    text = meta.get(META_WORKER_LOADS)
    if not text:
        return None
    return tuple(WorkerLoad(**entry) for entry in json.loads(text))
