"""`Trace`: an Arrow table in the trace schema plus its file metadata; read, write, validate, slice."""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from harness.atomic import atomic_path
from harness.errors import UserError
from harness.records.trace_schema import (
    META_CREATED_AT,
    META_KIND,
    META_SCHEMA_VERSION,
    TRACE_KIND,
    TRACE_SCHEMA,
    TRACE_SCHEMA_VERSION,
)


@dataclass
class Trace:
    """A validated request trace. `table` always has exactly the columns of `TRACE_SCHEMA`."""

    table: pa.Table
    metadata: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def arrivals(self) -> pa.Array:
        return self.table.column("arrival_s").combine_chunks()

    @property
    def duration_s(self) -> float:
        return float(pc.max(self.arrivals).as_py()) if len(self) else 0.0

    @classmethod
    def from_columns(cls, columns: dict[str, object], metadata: dict[str, str]) -> Trace:
        """Build from a dict of column arrays; absent optional columns become nulls; result is validated."""
        from harness.trace.validate import check_table

        n = len(next(iter(columns.values()))) if columns else 0
        arrays = []
        for fld in TRACE_SCHEMA:
            values = columns.get(fld.name)
            arrays.append(pa.nulls(n, fld.type) if values is None else pa.array(values, type=fld.type))
        table = pa.Table.from_arrays(arrays, schema=TRACE_SCHEMA)
        trace = cls(table, dict(metadata))
        check_table(trace.table, origin="<import>")
        return trace

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Trace:
        """Read and validate a trace file; every problem is a `UserError` naming the file and the fix."""
        from harness.trace.validate import check_table, conform_table

        path = Path(path)
        if not path.exists():
            raise UserError(
                f"{path}: no such trace file; give the path of a .parquet trace (make one with `replaybench import`)"
            )
        try:
            table = pq.read_table(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise UserError(
                f"{path}: not a readable Parquet file ({exc}); import the source with `replaybench import`"
            ) from None
        raw_meta = table.schema.metadata or {}
        metadata = {k.decode(): v.decode() for k, v in raw_meta.items() if not k.startswith(b"ARROW:")}
        kind = metadata.get(META_KIND)
        if kind is not None and kind != TRACE_KIND:
            raise UserError(f"{path}: this is a replaybench {kind} file, not a trace")
        table = conform_table(table, origin=str(path))
        check_table(table, origin=str(path))
        return cls(table, metadata)

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write atomically (never a half-written file), stamping schema version and creation time."""
        meta = {META_CREATED_AT: dt.datetime.now(dt.UTC).isoformat(timespec="seconds")} | self.metadata
        meta |= {META_SCHEMA_VERSION: TRACE_SCHEMA_VERSION, META_KIND: TRACE_KIND}
        table = self.table.replace_schema_metadata({k: str(v) for k, v in meta.items()})
        path = Path(path)
        try:
            with atomic_path(path) as tmp:
                pq.write_table(table, tmp, compression="zstd")
        except OSError as exc:
            raise UserError(f"{path}: cannot write the trace ({exc.strerror}); choose a writable path") from None
        return path

    def slice(
        self,
        start_s: float = 0.0,
        duration_s: float | None = None,
        limit: int | None = None,
        time_scale: float = 1.0,
    ) -> Trace:
        """Requests arriving in [start, start+duration), at most `limit`, re-based to 0 and scaled in time.

        `time_scale` < 1 compresses the trace (0.5 = twice the rate).
        """
        if time_scale <= 0:
            raise UserError(f"--time-scale must be > 0 (got {time_scale}); use 0.5 to double the rate")
        if limit is not None and limit < 1:
            raise UserError(f"--limit must be at least 1 (got {limit})")
        arrivals = self.arrivals
        mask = pc.greater_equal(arrivals, start_s)
        if duration_s is not None:
            mask = pc.and_(mask, pc.less(arrivals, start_s + duration_s))
        table = self.table.filter(mask)
        if limit is not None:
            table = table.slice(0, limit)
        if table.num_rows == 0:
            raise UserError(
                f"the slice start={start_s}s duration={duration_s}s holds no requests; "
                f"the trace spans 0-{self.duration_s:.1f}s"
            )
        arr = table.column("arrival_s")
        first = pc.min(arr).as_py()
        rebased = pc.multiply(pc.subtract(arr, first), time_scale)
        table = table.set_column(table.schema.get_field_index("arrival_s"), "arrival_s", rebased)
        meta = dict(self.metadata)
        if start_s or duration_s is not None or limit is not None or time_scale != 1.0:
            meta["slice"] = f"start={start_s} duration={duration_s} limit={limit} time_scale={time_scale}"
        return Trace(table, meta)
