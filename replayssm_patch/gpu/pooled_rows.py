"""Rows of one measurement run more than once on one GPU on one day, pooled into one row of all their repeats.

Why: a results file keeps only the newest row of a (variant, mode, batch), so a job run again on the same host
(``replayssm.sh JOB@TAG``) replaces the first run's row, and a ratio read from the file is the last run's alone.
Session 34's H200 rows at batch 256 differed by 10 % between two runs of the same arms on one host (the host's
own speed moved), so the figure that stands is the one over both: the history beside the file
(``<stem>.history.jsonl``, every row ever recorded) holds both runs, and a pooled row is their repeats together,
the window and step recomputed as engine_step makes them (the median of the repeats, their max - min as spread).
Rows without a GPU's UUID (before session 22) are never pooled: nothing says they shared a host.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from replayssm_patch.gpu.engine_step import median_and_spread
from replayssm_patch.gpu.row_file import RowFileError, history_path

POOL_KEY = ("variant", "mode", "batch", "prompt_tokens", "gpu_uuid", "date")


def pool_key(row: dict[str, Any]) -> tuple[Any, ...] | None:
    """The runs a row pools with share these values; None for a row that names no GPU."""
    return tuple(row.get(field) for field in POOL_KEY) if row.get("gpu_uuid") else None


def pooled_row(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One row of every repeat of `runs` (rows of one pool key, oldest first): the newest run's facts, the
    repeats of all, step and window recomputed over them, valid only if every run was, and the SM clock the mean
    of the runs' means; ``runs`` says how many rows it holds."""
    repeats = [rep for run in runs for rep in run.get("repeats", [])]
    step, step_spread = median_and_spread([rep["step_ms"] for rep in repeats])
    row = runs[-1] | {"repeats": repeats, "step_ms": step, "spread_ms": step_spread, "runs": len(runs)}
    windows = [rep["window"]["mean_ms"] for rep in repeats if rep.get("window")]
    if windows:
        row["window_step_ms"], row["window_spread_ms"] = median_and_spread(windows)
    row["valid"] = all(run.get("valid", True) for run in runs)
    row["problems"] = [problem for run in runs for problem in run.get("problems") or []]
    clocks = [mhz for run in runs if (mhz := (run.get("conditions") or {}).get("gpu_sm_mhz_mean")) is not None]
    if clocks:
        row["conditions"] = (runs[-1].get("conditions") or {}) | {"gpu_sm_mhz_mean": statistics.mean(clocks)}
    return row


def read_history(path: Path) -> list[dict[str, Any]]:
    """The rows recorded into the results file `path`, oldest first ([] when it has no history beside it)."""
    history = history_path(path)
    if not history.exists():
        return []
    rows = []
    for number, line in enumerate(history.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            raise RowFileError(
                f"{history}: line {number} is not JSON; mend or remove that line, or leave out --pool"
            ) from None
    return rows


def pool_rows(rows: Iterable[dict[str, Any]], history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` (a results file's) with each row that has more than one run of its pool key in `history` replaced
    by the pooled row of those runs."""
    runs: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for recorded in history:
        if (key := pool_key(recorded)) is not None:
            runs.setdefault(key, []).append(recorded)
    return [pooled_row(same) if len(same := runs.get(pool_key(row) or (), [])) > 1 else row for row in rows]
