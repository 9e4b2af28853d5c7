"""BurstGPT CSV (HPMLL/BurstGPT), v1.1 columns and v1.2 (adds `Session ID` and `Elapsed time`).

`Timestamp` is seconds since midnight of the trace's first day; arrivals become offsets from the first
row. Rows with 0 response tokens are requests that failed in production: they are kept (a replay should
still send them) and marked `finish_reason = "error"`, and the import summary counts them.
`Log Type` (Conversation log / API log) is kept as the tenant; `Elapsed time` (seconds) as `e2e_s`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
from harness.trace.outcome import FAILED_FINISH_REASON

WHAT = "a BurstGPT CSV (Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type)"
REQUIRED = ["Timestamp", "Request tokens", "Response tokens"]
SESSION_COLUMNS = ("Session ID", "SessionID")
OPTIONAL = ("Model", "Log Type", *SESSION_COLUMNS, "Elapsed time")


def import_burstgpt(path: Path, options: ImportOptions) -> ImportResult:
    table = read_csv_strings(path, WHAT, REQUIRED, OPTIONAL)
    n = table.num_rows
    seconds = convert(
        table.column("Timestamp"), pa.float64(), path, "Timestamp", "Timestamp is seconds since the start of the trace"
    ).to_numpy()
    prompt = convert(table.column("Request tokens"), pa.int64(), path, "Request tokens", "use whole numbers")
    output = convert(table.column("Response tokens"), pa.int64(), path, "Response tokens", "use whole numbers")
    output_tokens = token_counts(output.to_numpy(), path, "Response tokens")
    failed = output_tokens == 0
    columns: dict[str, object] = {
        "prompt_tokens": token_counts(prompt.to_numpy(), path, "Request tokens"),
        "output_tokens": output_tokens,
        **count_only_columns(n),
        "finish_reason": pa.array(np.where(failed, FAILED_FINISH_REASON, None), type=pa.string()),
    }
    names = set(table.column_names)
    if "Model" in names:
        columns["model"] = table.column("Model").combine_chunks()
    if "Log Type" in names:
        columns["tenant"] = table.column("Log Type").combine_chunks()
    session = next((c for c in SESSION_COLUMNS if c in names), None)
    if session:
        columns["session_id"] = pc.utf8_trim_whitespace(table.column(session).combine_chunks())
    if "Elapsed time" in names:
        columns["e2e_s"] = convert(
            table.column("Elapsed time"),
            pa.float64(),
            path,
            "Elapsed time",
            "Elapsed time is seconds",
            allow_empty=True,
        )
    prefix = options.id_prefix or default_id_prefix("burstgpt", path)
    clock = f"{seconds.min():g} s after 00:00 of the trace's first day"
    trace, reordered = assemble(seconds, columns, prefix, {META_CLOCK: clock, META_REDACTION: "drop"}, path)
    version = "v1.2" if session or "Elapsed time" in names else "v1.1"
    notes = [
        f"BurstGPT {version} columns, count-only: {n:,} requests, prompts are synthesised at replay",
        f"{int(failed.sum()):,} failed request(s) (0 response tokens) kept, marked finish_reason="
        f"{FAILED_FINISH_REASON!r}",
    ]
    return import_result(trace, reordered, notes, failed_rows=int(failed.sum()))
