"""Azure LLM inference traces (2023 and 2024 releases): `TIMESTAMP,ContextTokens,GeneratedTokens`.

TIMESTAMP is an absolute datetime with 7 fractional digits and, in 2023, no time zone; arrivals become
offsets from the first request. The files carry token counts only, so the trace is count-only
(redaction "drop"): prompts are synthesised at replay time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from harness.records.trace_schema import META_CLOCK, META_REDACTION
from harness.trace.importers.common import (
    ImportOptions,
    ImportResult,
    assemble,
    convert,
    count_only_columns,
    default_id_prefix,
    import_result,
    read_csv_strings,
    token_counts,
)

WHAT = "an Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens)"
COLUMNS = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]


def parse_timestamps(column: pa.ChunkedArray, path: Path) -> tuple[np.ndarray, str]:
    """Nanoseconds since the first row, and the first row's clock as text; zone-less and UTC-offset forms."""
    first = column[0].as_py() or ""
    zoned = first.endswith("Z") or (len(first) > 19 and first[-6] in "+-" and first[-3] == ":")
    target = pa.timestamp("ns", tz="UTC") if zoned else pa.timestamp("ns")
    fix = "timestamps look like 2023-11-16 18:15:46.6805900 (one format for the whole file)"
    stamps = convert(column, target, path, "TIMESTAMP", fix)
    ns = stamps.cast(pa.int64()).to_numpy()
    return ns - ns[0], first.strip()


def import_azure(path: Path, options: ImportOptions) -> ImportResult:
    table = read_csv_strings(path, WHAT, COLUMNS)
    offsets_ns, clock = parse_timestamps(table.column("TIMESTAMP"), path)
    counts = {}
    for source, target in (("ContextTokens", "prompt_tokens"), ("GeneratedTokens", "output_tokens")):
        values = convert(table.column(source), pa.int64(), path, source, "token counts are whole numbers")
        counts[target] = token_counts(values.to_numpy(), path, source)
    n = table.num_rows
    columns = {**counts, **count_only_columns(n)}
    prefix = options.id_prefix or default_id_prefix("azure", path, drop_words=("azurellminferencetrace",))
    trace, reordered = assemble(offsets_ns / 1e9, columns, prefix, {META_CLOCK: clock, META_REDACTION: "drop"}, path)
    notes = [f"count-only trace: {n:,} requests, prompts are synthesised at replay"]
    return import_result(trace, reordered, notes)
