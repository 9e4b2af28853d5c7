"""How late one replay worker's event loop runs: the receive side of replay fidelity.

Every chunk a worker reads is stamped when its event loop gets to it. A loop busy with other streams' chunks
gets there late, so every token time, ITL and TTFT it records is late by as much; send lag never sees it.
A timer on a fixed grid (a tick every PERIOD_S on time.monotonic()) records how late each tick is served: if
the loop stalls for D, every tick that fell due during the stall is served by the one wake-up at its end,
late by D, D - PERIOD_S, ..., the delay an event arriving at a random moment of the stall suffers. So the
samples are spread evenly over wall time, however long the loop's iterations. With uvloop the floor (an idle loop) is
about 0.2 ms p50 / 0.7 ms p99, libuv's millisecond timer granularity.

The samples go to `loop-<worker>.jsonl` beside the result segments, one line every REPORT_EVERY ticks
(lateness in whole microseconds, plus the process CPU time and wall time since the probe started), so a
replay whose process is killed still leaves all but the last 50 ms of them for `replay-recover`.
A tick costs a few microseconds and a line a few tens: together well below 0.1 % of a core.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import IO, Any

import numpy as np

from harness.records.worker_load import WorkerLoad, worker_load

PERIOD_S = 0.005
REPORT_EVERY = 10  # ticks per line written: every 50 ms, the beat the result segments are flushed on


def probe_path(directory: Path, worker: int) -> Path:
    """Named so that the result segments' glob (`worker-*.jsonl`) never reads it as rows."""
    return directory / f"loop-{worker}.jsonl"


class LoopProbe:
    """Samples the running loop's lateness until `stop()`; made at t0, just before `run()` becomes its task."""

    def __init__(self, path: Path, period_s: float = PERIOD_S) -> None:
        self.period_s = period_s
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by stop()
        self._lateness_us: list[int] = []
        self._wall0 = time.monotonic()
        self._cpu0 = time.process_time()

    async def run(self) -> None:
        due = self._wall0 + self.period_s
        while True:
            delay = due - time.monotonic()
            await asyncio.sleep(delay if delay > 0 else 0)
            now = time.monotonic()
            while due <= now:  # every tick that fell due by now is served by this one wake-up
                self._lateness_us.append(int((now - due) * 1e6))
                due += self.period_s
            if len(self._lateness_us) >= REPORT_EVERY:
                self._write()

    def _write(self) -> None:
        line = {
            "lateness_us": self._lateness_us,
            "cpu_s": time.process_time() - self._cpu0,
            "wall_s": time.monotonic() - self._wall0,
        }
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._file.flush()
        self._lateness_us = []

    def stop(self) -> None:
        """Write what is left (the run task must be cancelled first) and close the file."""
        self._write()
        os.fsync(self._file.fileno())
        self._file.close()


def _lines(path: Path) -> list[dict[str, Any]]:
    lines = []
    for text in path.read_text(encoding="utf-8").splitlines():
        try:
            lines.append(json.loads(text))
        except ValueError:  # a torn last line from a killed worker
            continue
    return lines


def read_worker_loads(directory: Path) -> tuple[WorkerLoad, ...] | None:
    """Each worker's receive lag and CPU share from its probe file; None when no worker left one (an old run)."""
    paths = sorted(directory.glob("loop-*.jsonl"), key=lambda p: int(p.stem.removeprefix("loop-")))
    if not paths:
        return None
    loads = []
    for path in paths:
        lines = _lines(path)
        lateness = np.array([v for line in lines for v in line["lateness_us"]], dtype=float) / 1e6
        cpu_s, wall_s = (lines[-1]["cpu_s"], lines[-1]["wall_s"]) if lines else (0.0, 0.0)
        loads.append(worker_load(int(path.stem.removeprefix("loop-")), lateness, cpu_s, wall_s))
    return tuple(loads)
