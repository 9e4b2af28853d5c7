"""The trace: one Parquet row per request, schema version and provenance in the file metadata."""

from __future__ import annotations

import pyarrow as pa

TRACE_SCHEMA_VERSION = "1"
TRACE_API_VALUES = ("completions", "chat")
REDACTION_MODES = ("none", "hash", "drop")

TRACE_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("arrival_s", pa.float64(), nullable=False),
        pa.field("session_id", pa.string()),
        pa.field("api", pa.string(), nullable=False),
        pa.field("model", pa.string()),
        pa.field("prompt", pa.string()),
        pa.field("messages", pa.string()),
        pa.field("prompt_tokens", pa.int32(), nullable=False),
        pa.field("prefix_block_ids", pa.list_(pa.int64())),
        pa.field("output_tokens", pa.int32(), nullable=False),
        pa.field("params", pa.string(), nullable=False),
        pa.field("tenant", pa.string()),
        pa.field("status", pa.int16()),
        pa.field("ttft_s", pa.float64()),
        pa.field("e2e_s", pa.float64()),
        pa.field("finish_reason", pa.string()),
    ]
)

REQUIRED_TRACE_COLUMNS = tuple(f.name for f in TRACE_SCHEMA if not f.nullable)

# File-level metadata keys (all values are strings in Parquet metadata).
META_SCHEMA_VERSION = "replaybench.schema_version"
META_KIND = "replaybench.kind"
META_SOURCE = "source"
META_CREATED_AT = "created_at"
META_CLOCK = "clock"
META_REDACTION = "redaction"
META_TOKENIZER = "tokenizer"
META_BLOCK_SIZE = "block_size"
TRACE_KIND = "trace"
