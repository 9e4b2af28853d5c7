"""Durable, incremental result rows: each worker appends finished rows to its own JSONL segment.

A row is written the moment its request finishes and handed to the OS within FLUSH_PERIOD_S (the worker
flushes on that beat: a flush per row costs a syscall per request, a sixth of a worker's CPU), so a killed
process loses at most the last 50 ms of finished rows, Ctrl-C/SIGTERM none (a power cut can lose what the
OS had not yet written; segments are fsync'ed on close). A torn last line from a killed writer is skipped
when reading. The run's metadata sits beside the segments so `recover_replay` can finish the result file
without the original process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from harness.replay.result_row import ResultRow

FLUSH_PERIOD_S = 0.05
META_FILE = "meta.json"
OWNER_FILE = "owner.pid"


def partial_dir(output: Path) -> Path:
    """Where a run writing `output` keeps its segments until the Parquet file is final."""
    return output.with_name(output.name + ".partial")


def segment_path(directory: Path, worker: int) -> Path:
    return directory / f"worker-{worker}.jsonl"


class SegmentWriter:
    """Append-only JSONL of `ResultRow`s, one line per finished request."""

    def __init__(self, path: Path) -> None:
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def write(self, row: ResultRow) -> None:
        # vars(), not dataclasses.asdict(): asdict deep-copies every token time, a third of a worker's CPU.
        self._file.write(json.dumps(vars(row), separators=(",", ":")) + "\n")

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()


def write_meta(directory: Path, meta: dict[str, str]) -> None:
    """Create the run's segment directory with its metadata and the id of the process that owns it."""
    directory.mkdir(parents=True, exist_ok=False)
    (directory / META_FILE).write_text(json.dumps(meta, indent=1))
    (directory / OWNER_FILE).write_text(str(os.getpid()))


def update_meta(directory: Path, extra: dict[str, str]) -> None:
    """Add keys once they are known (e.g. t0); written atomically so a crash never leaves half a file."""
    tmp = directory / (META_FILE + ".tmp")
    tmp.write_text(json.dumps(read_meta(directory) | extra, indent=1))
    tmp.replace(directory / META_FILE)


def owner_alive(directory: Path) -> bool:
    """Whether the process that started this run is still running (then its segments are not ours to finish)."""
    try:
        pid = int((directory / OWNER_FILE).read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return pid != os.getpid()


def read_meta(directory: Path) -> dict[str, str]:
    return json.loads((directory / META_FILE).read_text())


def read_rows(directory: Path) -> list[dict[str, Any]]:
    """Every complete row of every segment in `directory` (a torn final line is skipped)."""
    rows = []
    for path in sorted(directory.glob("worker-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows
