"""A JSON results file of rows keyed by (variant or arm, mode, batch, ...), filled by several runs and machines.

    {"what": "...", "command": "<latest>", "commands": [...], "machine": {...latest...}, "rows": [...]}

A new row replaces the row of the same key; rows stay ordered by the key's fields in turn: a variant or an arm
as VARIANTS and SPEC_ARMS list them, a mode as MODES does, any other field by value (None first). The file is
rewritten atomically after every row, so a crash keeps what was measured, under a lock, so processes on several
GPUs can merge into the same file. Every row recorded is also appended, with its command, to a history beside it
(``<stem>.history.jsonl``), so a rerun's row replaces the first in the file but not in the history (sessions 23
and 24 rebuilt each call's rows by hand from the calls' tarballs).
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.atomic import atomic_path
from replayssm_patch.gpu.variants import MODES, SPEC_ARMS, VARIANTS

ROW_KEY = ("variant", "mode", "batch")
RANKED = {"variant": list(VARIANTS), "arm": list(SPEC_ARMS), "mode": list(MODES)}  # fields in a listed order


class RowFileError(ValueError):
    """The file named is not such a results file; the message names the fix."""


def _rank(field: str, value: Any) -> tuple[Any, ...]:
    if field in RANKED:
        values = RANKED[field]
        return (values.index(value) if value in values else len(values),)
    return (value is not None, value)  # an unset field (None) sorts before every value, never against one


def _row_order(row: dict[str, Any], key: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(_rank(field, row[field]) for field in key)


def merge_rows(rows: Sequence[dict[str, Any]], new: dict[str, Any], key: tuple[str, ...] = ROW_KEY) -> list[dict]:
    """`rows` with `new` in place of any row of the same `key` values, ordered by the key's fields in turn."""
    mine = tuple(new[k] for k in key)
    kept = [r for r in rows if tuple(r.get(k) for k in key) != mine]
    return sorted([*kept, new], key=lambda r: _row_order(r, key))


def row_file_problem(path: Path, what: str) -> str | None:
    """Why rows cannot be merged into ``path`` (not a results file), as one line, or None."""
    try:
        read_row_file(path, what)
    except RowFileError as exc:
        return str(exc)
    return None


def read_row_file(path: Path, what: str) -> dict[str, Any]:
    """The file to merge into; a fresh payload saying `what` when it does not exist yet."""
    if not path.exists():
        return {"what": what, "rows": []}
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RowFileError(f"{path}: not readable JSON ({exc}); give another --out or move the file away") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("rows"), list):
        raise RowFileError(f"{path}: not a results file of rows (no 'rows' list); give another --out")
    return payload


def record_row(
    path: Path, row: dict[str, Any], what: str, command: str, machine: dict[str, Any], key: tuple[str, ...] = ROW_KEY
) -> dict[str, Any]:
    """Merge `row` into the file at `path`, stamped with the command and machine; returns what was written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # engines on several GPUs merge into one file: one at a time
        payload = read_row_file(path, what)
        commands = [c for c in payload.get("commands", []) if c != command] + [command]
        payload |= {"what": what, "command": command, "commands": commands, "machine": machine}  # the newest method
        payload["rows"] = merge_rows(payload["rows"], row, key)
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(payload, indent=1) + "\n")
        with open(history_path(path), "a") as history:
            history.write(json.dumps(row | {"command": command}) + "\n")
    return payload


def history_path(path: Path) -> Path:
    """Where every row recorded into the results file ``path`` is kept in the order measured."""
    return path.with_name(f"{path.stem}.history.jsonl")
