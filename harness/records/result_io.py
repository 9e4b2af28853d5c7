"""Read and write result files (one arm, one repeat) in the result schema."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from harness.atomic import atomic_path
from harness.errors import UserError
from harness.records.result_schema import (
    META_ARM,
    META_REPEAT,
    RESULT_KIND,
    RESULT_SCHEMA,
    RESULT_SCHEMA_VERSION,
    TEXT_CHUNKS,
)
from harness.records.trace_schema import META_KIND, META_SCHEMA_VERSION


def results_table(rows: Iterable[Mapping[str, object]]) -> pa.Table:
    """Rows (dicts keyed by result column; missing keys are null) -> a table in the result schema."""
    rows = list(rows)
    return pa.Table.from_pydict(
        {f.name: [row.get(f.name) for row in rows] for f in RESULT_SCHEMA}, schema=RESULT_SCHEMA
    )


def write_results(path: str | os.PathLike[str], table: pa.Table, metadata: Mapping[str, str]) -> Path:
    """Write a finished result table atomically with its run metadata (arm, repeat, validity inputs)."""
    meta = {META_SCHEMA_VERSION: RESULT_SCHEMA_VERSION, META_KIND: RESULT_KIND} | dict(metadata)
    table = table.cast(RESULT_SCHEMA).replace_schema_metadata({k: str(v) for k, v in meta.items()})
    path = Path(path)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return path


def read_results(path: str | os.PathLike[str]) -> tuple[pa.Table, dict[str, str]]:
    """Read a result file; returns the table and its metadata. Bad files are a one-line `UserError`."""
    path = Path(path)
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise UserError(f"{path}: not a readable result file ({exc}); re-run the replay") from None
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items() if not k.startswith(b"ARROW:")}
    if meta.get(META_KIND) != RESULT_KIND or META_ARM not in meta or META_REPEAT not in meta:
        raise UserError(f"{path}: not a replaybench result file; give a file written by `replaybench replay`")
    if meta.get(META_SCHEMA_VERSION) == "1":
        table = table.append_column("token_count_source", pa.array([TEXT_CHUNKS] * table.num_rows, pa.string()))
    return _with_later_columns(table).cast(RESULT_SCHEMA), meta


def _with_later_columns(table: pa.Table) -> pa.Table:
    """A file of an earlier schema lacks the columns added since, all nullable: they read as null. Schema 1 had no
    per-chunk token counts (each text chunk was one token, which its source column, added by the caller, says);
    schema 2 no tenant."""
    for field in RESULT_SCHEMA:
        if field.name not in table.column_names:
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    return table.select(RESULT_SCHEMA.names)
