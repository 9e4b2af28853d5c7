"""Turn a closed segment file into its Parquet part (a validated trace), then delete the segment."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from harness.record.naming import part_for_segment
from harness.record.row import ROW_FIELDS, RecordedRow
from harness.record.segment import read_segment
from harness.trace.model import Trace


@dataclass(frozen=True)
class PartWritten:
    """What became of one segment: its part (None when it held no rows), rows kept, torn lines skipped."""

    segment: Path
    part: Path | None
    rows: int
    bad_lines: int


def rows_to_trace(rows: list[RecordedRow], metadata: dict[str, str]) -> Trace:
    """Rows are appended as requests *finish*; a trace is ordered by *arrival*."""
    ordered = sorted(rows, key=lambda row: row.arrival_s)
    columns: dict[str, object] = {name: [getattr(row, name) for row in ordered] for name in ROW_FIELDS}
    return Trace.from_columns(columns, metadata)


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
