"""Turn a closed segment file into its Parquet part (a validated trace), then delete the segment."""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow.parquet as pq

from harness.record.naming import part_for_segment
from harness.record.row import ROW_FIELDS, RecordedRow
from harness.record.segment import read_segment, try_lock
from harness.records.trace_schema import META_CLOCK
from harness.trace.model import Trace

META_STARTED_AT = "replaybench.record.started_at"  # when the recorder started (segment rows count from here)
META_OFFSET = "replaybench.record.offset_s"  # the part's first arrival, in seconds after the recorder started


@dataclass(frozen=True)
class PartWritten:
    """What became of one segment: its part (None when it held no rows), rows kept, torn lines skipped."""

    segment: Path
    part: Path | None
    rows: int
    bad_lines: int


def rows_to_trace(rows: list[RecordedRow], metadata: dict[str, str]) -> Trace:
    """Rows are appended as requests *finish*; a trace is ordered by *arrival* and starts at its first arrival.

    Segment rows count from the recorder's start (metadata `clock`); each part is re-based so that it replays
    at once, and its `clock` becomes the absolute time of its first arrival (absolute = clock + arrival_s, as
    in every trace); the recorder's start and the part's offset from it are kept in the metadata.
    """
    ordered = sorted(rows, key=lambda row: row.arrival_s)
    origin = ordered[0].arrival_s
    rebased = [replace(row, arrival_s=row.arrival_s - origin) for row in ordered]
    columns: dict[str, object] = {name: [getattr(row, name) for row in rebased] for name in ROW_FIELDS}
    started_at = metadata[META_CLOCK]
    clock = dt.datetime.fromisoformat(started_at) + dt.timedelta(seconds=origin)
    meta = metadata | {
        META_CLOCK: clock.isoformat(timespec="microseconds"),
        META_STARTED_AT: started_at,
        META_OFFSET: f"{origin:.6f}",
    }
    return Trace.from_columns(columns, meta)


def finish_segment(segment: Path) -> PartWritten:
    """Write `segment`'s part atomically and delete the segment; raises UserError if the part cannot be written
    (the segment is then kept, so `--recover` can retry)."""
    part = part_for_segment(segment)
    if part.exists():  # written before a crash that came before the segment's deletion
        segment.unlink()
        return PartWritten(segment, part, pq.read_metadata(part).num_rows, 0)
    contents = read_segment(segment)
    if contents.rows:
        rows_to_trace(contents.rows, contents.metadata).write(part)
    segment.unlink()
    return PartWritten(segment, part if contents.rows else None, len(contents.rows), contents.bad_lines)


def finish_segment_when_free(segment: Path) -> PartWritten | None:
    """`finish_segment` under the segment's lock; None when a running recorder holds it, or it is already gone
    (another process converted it first)."""
    try:
        fd = try_lock(segment)
    except FileNotFoundError:
        return None
    if fd is None:
        return None
    try:
        return finish_segment(segment) if segment.exists() else None
    finally:
        os.close(fd)
