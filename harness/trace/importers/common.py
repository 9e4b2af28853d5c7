"""Shared machinery of the importers: reading sources with clear errors, ordering, ids and trace assembly.

Every importer turns its source into absolute arrival times plus columns; `assemble` sorts them stably,
re-bases arrivals to the first request, names requests after their source row and builds a validated
`Trace`. Parsing is vectorised (pyarrow / numpy) so million-row sources stay fast; the slow paths run
only to locate the offending row once something is already known to be wrong.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from harness.errors import UserError
from harness.records.trace_schema import META_SOURCE
from harness.trace.model import Trace

# `params` of a request whose sampling parameters the source does not record.
EMPTY_PARAMS = "{}"
MIN_ID_DIGITS = 6
INT32_MAX = 2**31 - 1


@dataclass
class ImportResult:
    """A freshly imported trace and what the user should know about how it was made."""

    trace: Trace
    notes: list[str] = field(default_factory=list)
    failed_rows: int = 0
    reordered_rows: int = 0


@dataclass(frozen=True)
class ImportOptions:
    """Format-independent import settings chosen on the command line."""

    id_prefix: str | None = None
    block_size: int | None = None


def require_file(path: Path, what: str) -> None:
    """Fail with one line when `path` is missing, a directory or empty."""
    if not path.exists():
        raise UserError(f"{path}: no such file; give the path of {what}")
    if path.is_dir():
        raise UserError(f"{path}: is a directory; give the path of a file inside it")
    if path.stat().st_size == 0:
        raise UserError(f"{path}: the file is empty; give {what} with at least one request")


def read_csv_strings(path: Path, what: str, required: list[str], optional: tuple[str, ...] = ()) -> pa.Table:
    """Read the named columns of a CSV as strings; a missing column or a malformed file is one `UserError`."""
    require_file(path, what)
    present = _csv_header(path, what)
    missing = [c for c in required if c not in present]
    if missing:
        raise UserError(
            f"{path}: missing column(s) {', '.join(missing)} (found: {', '.join(map(repr, present)) or 'none'}); "
            f"check the format name: this importer reads {what}"
        )
    wanted = [c for c in [*required, *optional] if c in present]
    repeated = [c for c in wanted if present.count(c) > 1]
    if repeated:
        raise UserError(f"{path}: column(s) {', '.join(repeated)} appear more than once in the header; keep one")
    try:
        table = pacsv.read_csv(
            path,
            # the header as parsed above (names trimmed), so " ContextTokens" still finds its column
            read_options=pacsv.ReadOptions(column_names=present, skip_rows=1),
            convert_options=pacsv.ConvertOptions(
                column_types=dict.fromkeys(wanted, pa.string()), include_columns=wanted, strings_can_be_null=True
            ),
        )
    except (pa.ArrowException, UnicodeDecodeError, OSError) as exc:
        raise UserError(f"{path}: not a well-formed CSV ({first_line(exc)}); give {what}") from None
    if table.num_rows == 0:
        raise UserError(f"{path}: the CSV has a header but no rows; give {what} with at least one request")
    return table


def _csv_header(path: Path, what: str) -> list[str]:
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            return [name.strip() for name in next(csv.reader(handle), [])]
    except (UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"{path}: not a UTF-8 CSV file ({first_line(exc)}); give {what}") from None


def convert(
    column: pa.Array | pa.ChunkedArray, to: pa.DataType, path: Path, name: str, fix: str, allow_empty: bool = False
) -> pa.Array:
    """Cast a string column to `to`; the first empty or unparsable value becomes one `UserError` with its row."""
    if column.null_count and not allow_empty:
        row = int(np.flatnonzero(pc.is_null(column).to_numpy(zero_copy_only=False))[0])
        raise UserError(f"{path}: column {name} is empty at data row {row + 1}; {fix}")
    try:
        converted = _cast(column, to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        row = _first_uncastable(column, to)
        raise UserError(
            f"{path}: column {name} has {column[row].as_py()!r} at data row {row + 1}, "
            f"not a valid {_type_word(to)}; {fix}"
        ) from None
    return converted.combine_chunks() if isinstance(converted, pa.ChunkedArray) else converted


def _cast(column: pa.Array | pa.ChunkedArray, to: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """Cast as is; only when that fails pay for a whitespace-trimmed copy (`" 3"` is still 3)."""
    try:
        return pc.cast(column, to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pc.cast(pc.utf8_trim_whitespace(column), to)


def _first_uncastable(column: pa.Array, to: pa.DataType) -> int:
    """Bisect for the first value that does not cast (O(n) total work; runs only on the error path)."""
    lo, hi = 0, len(column)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            _cast(column.slice(lo, mid - lo), to)
            lo = mid
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            hi = mid
    return lo


def _type_word(to: pa.DataType) -> str:
    if pa.types.is_integer(to):
        return "whole number"
    if pa.types.is_floating(to):
        return "number"
    if pa.types.is_timestamp(to):
        return "timestamp (YYYY-MM-DD HH:MM:SS.fffffff)"
    return str(to)


def token_counts(values: np.ndarray, path: Path, name: str) -> np.ndarray:
    """Check that token counts are in 0..2^31-1 and return them as int32."""
    bad = (values < 0) | (values > INT32_MAX)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise UserError(
            f"{path}: column {name} is {values[row]} at data row {row + 1}; "
            "token counts must be between 0 and 2147483647"
        )
    return values.astype(np.int32)


def iter_jsonl(path: Path, what: str) -> Iterator[tuple[int, dict]]:
    """Yield (line number, object) for every non-blank line; a line that is not a JSON object is a `UserError`."""
    require_file(path, what)
    seen = False
    try:
        with path.open(encoding="utf-8") as handle:
            for lineno, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except (json.JSONDecodeError, RecursionError) as exc:
                    raise UserError(
                        f"{path}:{lineno}: not valid JSON ({first_line(exc)}); "
                        f"give {what} with one JSON object per line"
                    ) from None
                if not isinstance(obj, dict):
                    raise UserError(
                        f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}; "
                        f"give {what} with one JSON object per line"
                    )
                seen = True
                yield lineno, obj
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text file; give {what}") from None
    if not seen:
        raise UserError(f"{path}: no requests (only blank lines); give {what} with at least one request")


def json_number(obj: dict, key: str, path: Path, lineno: int, *, integer: bool = False, signed: bool = False) -> float:
    """The finite number under `key` (>= 0 unless `signed`; a whole number when `integer`), or a `UserError`."""
    if key not in obj:
        raise UserError(
            f"{path}:{lineno}: missing field {key!r} (found: {', '.join(map(repr, obj)) or 'none'}); "
            f"add {key!r} to every line"
        )
    value = obj[key]
    ok = isinstance(value, int | float) and not isinstance(value, bool) and bool(np.isfinite(value))
    ok = ok and (signed or value >= 0)
    if ok and integer:
        ok = float(value).is_integer() and value <= INT32_MAX
    if not ok:
        kind = "a whole number between 0 and 2147483647" if integer else "a finite number" + ("" if signed else " >= 0")
        raise UserError(f"{path}:{lineno}: field {key!r} is {value!r}; it must be {kind}")
    return int(value) if integer else float(value)


def json_block_ids(obj: dict, key: str, path: Path, lineno: int) -> list[int] | None:
    """The list of 64-bit integer block ids under `key` (None when absent), or a `UserError`."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**64 for v in value
    ):
        raise UserError(f"{path}:{lineno}: field {key!r} must be a list of integer block ids, got {value!r:.60}")
    # Unsigned 64-bit hashes keep their bit pattern in the signed int64 column.
    return [v - 2**64 if v >= 2**63 else v for v in value]


def request_ids(prefix: str, rows: np.ndarray, total: int) -> pa.Array:
    """`prefix-000123` for source row 123; zero-padded so ids sort like rows."""
    digits = max(MIN_ID_DIGITS, len(str(max(total - 1, 0))))
    numbers = pc.utf8_lpad(pc.cast(pa.array(rows, type=pa.int64()), pa.string()), width=digits, padding="0")
    return pc.binary_join_element_wise(pa.scalar(prefix + "-"), numbers, "")


def default_id_prefix(fmt: str, path: Path, drop_words: tuple[str, ...] = ()) -> str:
    """A readable, stable prefix from the format and the file name (`azure-conv`, `burstgpt-1-first400`)."""
    words = [w for w in re.split(r"[^a-z0-9]+", path.stem.lower()) if w and w not in drop_words]
    slug = "-".join(words)
    if slug.startswith(fmt):
        return slug
    return f"{fmt}-{slug}" if slug else fmt


def constant_strings(value: str, n: int) -> pa.Array:
    """A string column holding `value` n times, built without a Python loop."""
    return pc.cast(
        pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), pa.array([value])), pa.string()
    )


def count_only_columns(n: int) -> dict[str, pa.Array]:
    """How a source without request bodies replays: plain completions with default sampling parameters."""
    return {"api": constant_strings("completions", n), "params": constant_strings(EMPTY_PARAMS, n)}


def assemble(
    absolute_s: np.ndarray,
    columns: dict[str, pa.Array | np.ndarray | list],
    id_prefix: str,
    metadata: dict[str, str],
    source: Path,
) -> tuple[Trace, int]:
    """Order rows by arrival (stable: ties keep file order), re-base to the first arrival, name and validate.

    Returns the trace and how many rows were out of order in the source.
    """
    n = len(absolute_s)
    if not np.isfinite(absolute_s).all():
        row = int(np.flatnonzero(~np.isfinite(absolute_s))[0])
        raise UserError(f"{source}: the arrival time at data row {row + 1} is not finite; fix or remove that row")
    order = np.argsort(absolute_s, kind="stable")
    reordered = int(np.count_nonzero(order != np.arange(n)))
    ordered_times = absolute_s[order]
    arrays: dict[str, object] = {
        "request_id": request_ids(id_prefix, order, n),
        "arrival_s": ordered_times - ordered_times[0],
    }
    take = pa.array(order)
    for name, values in columns.items():
        if isinstance(values, np.ndarray):
            arrays[name] = values[order]
        elif isinstance(values, list):
            arrays[name] = [values[i] for i in order]
        else:
            arrays[name] = values.take(take) if reordered else values
    meta = {META_SOURCE: str(source)} | metadata
    try:
        trace = Trace.from_columns(arrays, meta)
    except UserError as problem:
        raise UserError(f"{source}: {problem}".replace("<import>: ", "")) from None
    return trace, reordered


def import_result(trace: Trace, reordered: int, notes: list[str], failed_rows: int = 0) -> ImportResult:
    """Every importer's ending: its own notes, then (when `assemble` had to sort rows) a note saying how many."""
    if reordered:
        notes = [*notes, f"{reordered:,} rows were out of time order in the source and were sorted"]
    return ImportResult(trace, notes, failed_rows=failed_rows, reordered_rows=reordered)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
