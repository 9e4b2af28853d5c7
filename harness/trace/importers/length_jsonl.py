"""JSONL traces of request lengths and prefix blocks, one object per line:
`{"timestamp": T, "input_length": N, "output_length": M, "hash_ids": [block ids]}`.

Mooncake/Kimi traces use this shape with timestamps in milliseconds and 512-token blocks; the
`timed_trace` dataset of `vllm bench serve` reads the same fields with timestamps in seconds (its
`--timed-trace-sec-multiplier` defaults to 1) and 16-token blocks by default
(`--timed-trace-chunk-hash-size`). `hash_ids` become `prefix_block_ids`; the block size goes in metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from harness.errors import UserError
from harness.records.trace_schema import META_BLOCK_SIZE, META_CLOCK, META_REDACTION
from harness.trace.importers.common import (
    ImportOptions,
    ImportResult,
    assemble,
    count_only_columns,
    default_id_prefix,
    import_result,
    iter_jsonl,
    json_block_ids,
    json_number,
)

TIMESTAMP, INPUT_LENGTH, OUTPUT_LENGTH, HASH_IDS = "timestamp", "input_length", "output_length", "hash_ids"


@dataclass(frozen=True)
class LengthJsonlFormat:
    """What distinguishes one dialect of the length JSONL from another."""

    name: str
    description: str
    units_per_second: float
    unit: str
    default_block_size: int

    @property
    def what(self) -> str:
        return f"a {self.description} JSONL ({TIMESTAMP} in {self.unit}, {INPUT_LENGTH}, {OUTPUT_LENGTH}, {HASH_IDS})"


MOONCAKE = LengthJsonlFormat("mooncake", "Mooncake", 1000.0, "ms", 512)
VLLM_TIMED = LengthJsonlFormat("vllm-timed", "vLLM timed_trace", 1.0, "s", 16)


def import_length_jsonl(path: Path, options: ImportOptions, fmt: LengthJsonlFormat) -> ImportResult:
    block_size = fmt.default_block_size if options.block_size is None else options.block_size
    if block_size < 1:
        raise UserError(f"--block-size must be at least 1 token (got {block_size})")
    times, prompts, outputs, blocks = [], [], [], []
    for lineno, obj in iter_jsonl(path, fmt.what):
        times.append(json_number(obj, TIMESTAMP, path, lineno, signed=True))
        prompts.append(json_number(obj, INPUT_LENGTH, path, lineno, integer=True))
        outputs.append(json_number(obj, OUTPUT_LENGTH, path, lineno, integer=True))
        blocks.append(json_block_ids(obj, HASH_IDS, path, lineno))
    n = len(times)
    stamps = np.asarray(times, dtype=np.float64)
    columns: dict[str, object] = {
        "prompt_tokens": np.asarray(prompts, dtype=np.int32),
        "output_tokens": np.asarray(outputs, dtype=np.int32),
        "prefix_block_ids": pa.array(blocks, type=pa.list_(pa.int64())),
        **count_only_columns(n),
    }
    with_blocks = sum(b is not None for b in blocks)
    metadata = {
        META_CLOCK: f"{stamps.min():g} {fmt.unit} on the source's clock",
        META_REDACTION: "hash" if with_blocks else "drop",
        META_BLOCK_SIZE: str(block_size),
    }
    prefix = options.id_prefix or default_id_prefix(fmt.name.split("-")[0], path)
    # re-base in source units before converting, so whole milliseconds map to the nearest float seconds
    trace, reordered = assemble((stamps - stamps.min()) / fmt.units_per_second, columns, prefix, metadata, path)
    notes = [
        f"{n:,} requests, {with_blocks:,} with prefix blocks of {block_size} tokens; prompts are synthesised at replay"
    ]
    return import_result(trace, reordered, notes)
