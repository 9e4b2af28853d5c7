"""Write a trace as length JSONL (Mooncake, or vLLM's `timed_trace`): timestamp, lengths, prefix blocks.

The formats carry no text, ids or parameters; arrival times, token counts and prefix blocks survive
an export -> import round trip (Mooncake rounds times to whole milliseconds, as the format does).
Rows without prefix blocks get fresh, never-shared block ids covering their prompt, because both
consumers build the prompt from `hash_ids` and would otherwise send an empty one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.atomic import atomic_path
from harness.errors import UserError
from harness.records.trace_schema import META_BLOCK_SIZE
from harness.trace.importers.length_jsonl import (
    HASH_IDS,
    INPUT_LENGTH,
    OUTPUT_LENGTH,
    TIMESTAMP,
    LengthJsonlFormat,
)
from harness.trace.model import Trace


@dataclass
class ExportResult:
    """What was written, and what the user must know to replay it elsewhere (`notes`)."""

    path: Path
    rows: int
    block_size: int
    synthesised_rows: int
    notes: list[str] = field(default_factory=list)


def _timestamps(arrivals: np.ndarray, fmt: LengthJsonlFormat) -> list[float | int]:
    units = arrivals * fmt.units_per_second
    if fmt.units_per_second == 1:
        return units.tolist()
    return np.rint(units).astype(np.int64).tolist()


def _block_lists(trace: Trace, block_size: int) -> tuple[list[list[int]], int]:
    """Each row's block ids; rows without any get fresh ids (counted) covering ceil(prompt/block) blocks."""
    blocks = trace.table.column("prefix_block_ids").to_pylist()
    prompts = trace.table.column("prompt_tokens").to_numpy()
    used = [b for row in blocks if row for b in row]
    next_id = max(used) + 1 if used else 1
    synthesised = 0
    for i, row in enumerate(blocks):
        if row is None:
            count = math.ceil(int(prompts[i]) / block_size)
            blocks[i] = list(range(next_id, next_id + count))
            next_id += count
            synthesised += 1
    return blocks, synthesised


def export_length_jsonl(trace: Trace, path: Path, fmt: LengthJsonlFormat) -> ExportResult:
    block_size = int(trace.metadata.get(META_BLOCK_SIZE) or fmt.default_block_size)
    blocks, synthesised = _block_lists(trace, block_size)
    times = _timestamps(trace.arrivals.to_numpy(), fmt)
    prompts = trace.table.column("prompt_tokens").to_pylist()
    outputs = trace.table.column("output_tokens").to_pylist()
    path = Path(path)
    try:
        with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as out:
            for t, p, o, b in zip(times, prompts, outputs, blocks, strict=True):
                out.write(json.dumps({TIMESTAMP: t, INPUT_LENGTH: p, OUTPUT_LENGTH: o, HASH_IDS: b}) + "\n")
    except OSError as exc:
        raise UserError(f"{path}: cannot write the export ({exc.strerror}); choose a writable path") from None
    result = ExportResult(path, len(trace), block_size, synthesised)
    if synthesised:
        result.notes.append(
            f"{synthesised:,} request(s) had no prefix blocks: gave them unique blocks of "
            f"{block_size} tokens so consumers build prompts of the recorded length"
        )
    if block_size != fmt.default_block_size:
        result.notes.append(
            f"blocks are {block_size} tokens, not the format's usual {fmt.default_block_size}: "
            f"import back with --block-size {block_size}"
        )
    result.notes.append(
        f"replay with vLLM: vllm bench serve --dataset-name timed_trace --dataset-path {path} "
        f"--num-prompts {len(trace)} --self-timed --ignore-eos --timed-trace-chunk-hash-size {block_size} "
        f"--timed-trace-sec-multiplier {1 / fmt.units_per_second:g}"
    )
    return result
