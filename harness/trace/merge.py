"""Combine trace parts (a recorder's rotated or per-worker files) into one trace.

By default parts are placed on one time line by their absolute clock: a part's request arrives at
`clock + arrival_s` (the trace convention), so the rotated parts of one recorder, or the parts its workers
wrote at the same time, interleave exactly as the traffic did. `concat=True` instead appends parts back to
back in the given order, for parts without a usable clock. Request ids must stay unique: a collision is
refused unless `prefix_ids=True`, which prefixes every id with its part's file stem (`prod-0002/<id>`), so
ids never change silently.
"""

from __future__ import annotations

import datetime as dt
import glob
import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from harness.errors import UserError
from harness.records.trace_schema import (
    META_BLOCK_SIZE,
    META_CLOCK,
    META_CREATED_AT,
    META_REDACTION,
    META_SOURCE,
    META_TOKENIZER,
)
from harness.trace.model import Trace
from harness.trace.validate import check_table

META_MERGE_MODE = "replaybench.merge.mode"  # "clock" or "concat"
META_MERGE_PART_SOURCES = "replaybench.merge.part_sources"  # JSON list: each part's own `source`
PER_FILE_KEYS = (META_CREATED_AT, "slice")  # describe one file, never carried into the merged trace


@dataclass(frozen=True)
class Part:
    path: Path
    trace: Trace


def expand_part_paths(args: list[str], output: Path) -> list[Path]:
    """Paths as given; a directory means its `*.parquet` files and a quoted glob its matches (sorted by name).

    The output file is left out of directory and glob matches, so merging a directory twice is harmless.
    """
    paths: list[Path] = []
    for arg in args:
        if Path(arg).is_dir():
            found = sorted(Path(arg).glob("*.parquet"))
        elif glob.has_magic(arg):
            found = sorted(map(Path, glob.glob(arg)))
        else:
            if Path(arg).resolve() == output.resolve():
                raise UserError(f"{arg}: the output would overwrite this part; choose another -o path")
            paths.append(Path(arg))
            continue
        found = [path for path in found if path.resolve() != output.resolve()]
        if not found:
            raise UserError(f"{arg}: no trace parts (.parquet) found there; give part files, a directory or a glob")
        paths.extend(found)
    return list(dict.fromkeys(paths))


def _absolute_clock(part: Part) -> dt.datetime:
    text = part.trace.metadata.get(META_CLOCK)
    try:
        return dt.datetime.fromisoformat(text or "")
    except ValueError:
        raise UserError(
            f"{part.path}: no absolute clock (metadata clock = {text!r}), so its place in time is "
            "unknown; add --concat to append the parts back to back in the order given"
        ) from None


def _clock_offsets(parts: list[Part]) -> tuple[list[float], str]:
    """Seconds to add to each part's arrivals to put them on one time line, and that line's clock (text)."""
    clocks = [_absolute_clock(part) for part in parts]
    if len({clock.tzinfo is None for clock in clocks}) > 1:
        naive = next(part.path for part, clock in zip(parts, clocks, strict=True) if clock.tzinfo is None)
        raise UserError(
            f"{naive}: its clock has no UTC offset while other parts' clocks do, so they cannot be "
            "ordered; add --concat to append the parts back to back"
        )
    origin = min(clocks)
    offsets = [(clock - origin).total_seconds() for clock in clocks]
    starts = [float(pc.min(part.trace.arrivals).as_py()) for part in parts]
    first = min(offset + start for offset, start in zip(offsets, starts, strict=True))
    clock = origin + dt.timedelta(seconds=first)
    return [offset - first for offset in offsets], clock.isoformat(timespec="microseconds")


def _concat_offsets(parts: list[Part]) -> list[float]:
    """Each part starts where the previous one's last request arrived."""
    offsets, cursor = [], 0.0
    for part in parts:
        arrivals = part.trace.arrivals
        offset = cursor - float(pc.min(arrivals).as_py())
        offsets.append(offset)
        cursor = offset + float(pc.max(arrivals).as_py())
    return offsets


def _agreed(parts: list[Part], key: str, *, when_present: bool) -> str | None:
    """The one value of `key` all parts share; refuse when they differ (missing counts unless `when_present`)."""
    values = {part.path: part.trace.metadata.get(key) for part in parts}
    distinct = {value for value in values.values() if value is not None or not when_present}
    if len(distinct) > 1:
        shown = ", ".join(f"{path.name}={value or 'unset'}" for path, value in values.items())
        raise UserError(f"parts disagree on {key} ({shown}); merge only parts recorded with the same {key}")
    return next(iter(distinct), None)


def _merged_metadata(parts: list[Part], mode: str, clock: str | None) -> dict[str, str]:
    """Keys every part agrees on, the checked redaction/tokenizer/block size, and where the trace came from."""
    redaction = _agreed(parts, META_REDACTION, when_present=False)
    checked = {key: _agreed(parts, key, when_present=True) for key in (META_TOKENIZER, META_BLOCK_SIZE)}
    common = dict(parts[0].trace.metadata)
    for part in parts[1:]:
        common = {k: v for k, v in common.items() if part.trace.metadata.get(k) == v}
    for key in (*PER_FILE_KEYS, META_CLOCK):
        common.pop(key, None)
    meta = common | {k: v for k, v in checked.items() if v is not None}
    if redaction is not None:
        meta[META_REDACTION] = redaction
    if clock is not None:
        meta[META_CLOCK] = clock
    meta[META_SOURCE] = ", ".join(str(part.path) for part in parts)
    meta[META_MERGE_MODE] = mode
    meta[META_MERGE_PART_SOURCES] = json.dumps([part.trace.metadata.get(META_SOURCE) for part in parts])
    return meta


def _ids(parts: list[Part], prefix_ids: bool) -> list[pa.ChunkedArray]:
    ids = [part.trace.table.column("request_id") for part in parts]
    if prefix_ids:
        ids = [
            pc.binary_join_element_wise(f"{part.path.stem}/", column, "")
            for part, column in zip(parts, ids, strict=True)
        ]
    combined = pa.chunked_array([chunk for column in ids for chunk in column.chunks], type=pa.string())
    if pc.count_distinct(combined).as_py() == len(combined):
        return ids
    dup = next(v["values"] for v in pc.value_counts(combined).to_pylist() if v["counts"] > 1)
    holders = [part.path.name for part, column in zip(parts, ids, strict=True) if pc.any(pc.equal(column, dup)).as_py()]
    fix = (
        "two parts share a file name; rename one"
        if prefix_ids
        else "add --prefix-ids to prefix every id with its part's file name"
    )
    raise UserError(f"request id {dup!r} is in more than one part ({', '.join(holders)}); {fix}")


def merge_parts(parts: list[Part], *, concat: bool = False, prefix_ids: bool = False) -> Trace:
    """One trace ordered by arrival (stably: ties keep part order, then row order); metadata checked to agree."""
    if concat:
        offsets, clock, mode = _concat_offsets(parts), parts[0].trace.metadata.get(META_CLOCK), "concat"
    else:
        (offsets, clock), mode = _clock_offsets(parts), "clock"
    metadata = _merged_metadata(parts, mode, clock)
    ids = _ids(parts, prefix_ids)
    tables = []
    for part, offset, column in zip(parts, offsets, ids, strict=True):
        table = part.trace.table
        table = table.set_column(table.schema.get_field_index("request_id"), "request_id", column)
        arrival = pc.max_element_wise(pc.add(table.column("arrival_s"), offset), 0.0)  # no -1e-16 from rounding
        tables.append(table.set_column(table.schema.get_field_index("arrival_s"), "arrival_s", arrival))
    merged = pa.concat_tables(tables)
    if not concat:
        merged = merged.sort_by("arrival_s")  # Arrow's sort is stable
    merged = merged.combine_chunks()
    check_table(merged, origin="<merged trace>")
    return Trace(merged, metadata)
