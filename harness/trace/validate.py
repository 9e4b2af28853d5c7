"""Trace validation: each problem becomes one line naming the column, row, value and the fix."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from harness.errors import UserError
from harness.records.trace_schema import REQUIRED_TRACE_COLUMNS, TRACE_API_VALUES, TRACE_SCHEMA

MAX_PROBLEMS_SHOWN = 5


class TraceInvalid(UserError):
    """One or more validation problems; the message lists them one per line (first few)."""

    def __init__(self, origin: str, problems: list[str]) -> None:
        self.problems = problems
        shown = problems[:MAX_PROBLEMS_SHOWN]
        more = f" (+{len(problems) - len(shown)} more)" if len(problems) > len(shown) else ""
        super().__init__(f"{origin}: invalid trace: " + "; ".join(shown) + more)


def conform_table(table: pa.Table, origin: str) -> pa.Table:
    """Return `table` with exactly the schema's columns in order and types; missing optional columns
    become nulls, extra or missing required columns and uncastable types are errors."""
    problems: list[str] = []
    names = set(table.column_names)
    missing = [c for c in REQUIRED_TRACE_COLUMNS if c not in names]
    if missing:
        problems.append(
            f"missing required column(s) {', '.join(missing)}; re-import the source with `replaybench import`"
        )
    extra = sorted(names - set(TRACE_SCHEMA.names))
    if extra:
        problems.append(
            f"unknown column(s) {', '.join(extra)}; drop them or rename to the trace schema "
            "(see README, 'Trace format')"
        )
    if problems:
        raise TraceInvalid(origin, problems)
    arrays = []
    for fld in TRACE_SCHEMA:
        if fld.name not in names:
            arrays.append(pa.nulls(table.num_rows, fld.type))
            continue
        column = table.column(fld.name)
        try:
            arrays.append(column.cast(fld.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            problems.append(
                f"column {fld.name} has type {column.type}, expected {fld.type}; convert it before importing"
            )
    if problems:
        raise TraceInvalid(origin, problems)
    return pa.Table.from_arrays(arrays, schema=TRACE_SCHEMA)


def _first_bad_row(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def check_table(table: pa.Table, origin: str) -> None:
    """Raise `TraceInvalid` listing every kind of problem found (first offending row of each)."""
    problems: list[str] = []
    if table.num_rows == 0:
        raise TraceInvalid(origin, ["the trace has no requests; import a non-empty source"])
    for name in REQUIRED_TRACE_COLUMNS:
        nulls = table.column(name).null_count
        if nulls:
            row = _first_bad_row(table.column(name).is_null().to_numpy(zero_copy_only=False))
            problems.append(f"column {name} has {nulls} empty value(s), first at row {row}; fill it in")
    arrivals = table.column("arrival_s").to_numpy()
    bad = ~np.isfinite(arrivals) | (arrivals < 0)
    if bad.any():
        row = _first_bad_row(bad)
        problems.append(f"arrival_s row {row} is {arrivals[row]}; arrival times must be finite and >= 0")
    elif len(arrivals) > 1 and (np.diff(arrivals) < 0).any():
        row = _first_bad_row(np.diff(arrivals) < 0) + 1
        problems.append(
            f"arrival_s decreases at row {row} ({arrivals[row - 1]} -> {arrivals[row]}); sort the trace by arrival time"
        )
    for name in ("prompt_tokens", "output_tokens"):
        values = table.column(name).to_numpy(zero_copy_only=False)
        negative = values < 0
        if negative.any():
            row = _first_bad_row(negative)
            problems.append(f"{name} row {row} is {values[row]}; token counts must be >= 0")
    for name in ("ttft_s", "e2e_s"):
        values = table.column(name).to_numpy(zero_copy_only=False).astype(float)
        bad = ~np.isnan(values) & (~np.isfinite(values) | (values < 0))
        if bad.any():
            row = _first_bad_row(bad)
            problems.append(f"{name} row {row} is {values[row]}; latencies must be finite and >= 0")
    apis = table.column("api")
    bad_api = pc.invert(pc.is_in(apis, value_set=pa.array(TRACE_API_VALUES))).to_numpy(zero_copy_only=False)
    if bad_api.any():
        row = _first_bad_row(bad_api)
        problems.append(f"api row {row} is {apis[row].as_py()!r}; use one of {', '.join(TRACE_API_VALUES)}")
    ids = table.column("request_id")
    if pc.count_distinct(ids).as_py() != table.num_rows:
        counts = pc.value_counts(ids)
        dup = next(v["values"] for v in counts.to_pylist() if v["counts"] > 1)
        problems.append(f"request_id {dup!r} appears more than once; request ids must be unique")
    if problems:
        raise TraceInvalid(origin, problems)
