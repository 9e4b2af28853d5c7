"""The loop probe on a real event loop, its files, and the per-worker statistics stored in result metadata."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import numpy as np
import pytest

from harness.records.result_schema import META_WORKER_LOADS
from harness.records.worker_load import WorkerLoad, loads_from_meta, loads_to_meta, worker_load
from harness.replay.loop_probe import PERIOD_S, LoopProbe, probe_path, read_worker_loads

STALL_S = 0.05


def run_probe_with_a_stall(path: Path) -> None:
    """Sample a real loop for a few ticks, block it for STALL_S (a busy callback), sample a few more."""

    async def main() -> None:
        probe = LoopProbe(path)
        sampling = asyncio.create_task(probe.run())
        await asyncio.sleep(4 * PERIOD_S)
        time.sleep(STALL_S)  # the loop can serve no timer meanwhile
        await asyncio.sleep(4 * PERIOD_S)
        sampling.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sampling
        probe.stop()

    asyncio.run(main())


def lateness_us(path: Path) -> list[int]:
    return [v for line in path.read_text().splitlines() for v in json.loads(line)["lateness_us"]]


@pytest.mark.timing
def test_a_stall_is_recorded_for_every_tick_that_fell_due_in_it(tmp_path: Path) -> None:
    path = probe_path(tmp_path, 0)
    run_probe_with_a_stall(path)
    samples = np.array(sorted(lateness_us(path), reverse=True))
    worst = samples[0]
    assert worst >= (STALL_S - PERIOD_S) * 1e6
    # Ticks due during the stall are all served by the wake-up at its end: late by D, D - period, D - 2 periods...
    for k in range(int(STALL_S / PERIOD_S) - 1):
        assert np.min(np.abs(samples - (worst - k * PERIOD_S * 1e6))) <= 2, k
    (load,) = read_worker_loads(tmp_path) or ()
    assert load.worker == 0 and load.samples == len(samples)
    assert load.receive_lag_max_s == pytest.approx(samples[0] / 1e6)
    assert load.cpu_share is not None and load.cpu_share > 0


def test_probe_files_survive_a_torn_line_and_are_ordered_by_worker(tmp_path: Path) -> None:
    for worker, values in ((10, [3000, 1000]), (2, [500])):
        line = {"lateness_us": values, "cpu_s": 0.5, "wall_s": 2.0}
        probe_path(tmp_path, worker).write_text(json.dumps(line) + '\n{"lateness_us": [9')
    assert not (tmp_path / "worker-2.jsonl").exists()  # never where the result segments' glob looks
    loads = read_worker_loads(tmp_path)
    assert [w.worker for w in loads] == [2, 10]
    assert loads[1] == WorkerLoad(10, 2, 0.002, pytest.approx(0.00298), 0.003, 0.25)


def test_no_probe_files_means_not_measured(tmp_path: Path) -> None:
    assert read_worker_loads(tmp_path) is None


def test_worker_load_quantiles_and_cpu_share() -> None:
    load = worker_load(3, np.arange(101) / 1000, cpu_s=0.5, wall_s=2.0)
    assert load == WorkerLoad(3, 101, 0.05, pytest.approx(0.099), 0.1, 0.25)
    assert worker_load(0, np.array([]), cpu_s=0.0, wall_s=0.0) == WorkerLoad(0, 0, None, None, None, None)


def test_worker_loads_round_trip_through_metadata() -> None:
    loads = (WorkerLoad(0, 10, 0.001, 0.004, 0.006, 0.3), WorkerLoad(1, 0, None, None, None, None))
    meta = loads_to_meta(loads)
    assert json.loads(meta[META_WORKER_LOADS])[0]["receive_lag_p99_s"] == 0.004
    assert loads_from_meta(meta) == loads
    assert loads_from_meta({}) is None  # a file written before receive lag was measured
