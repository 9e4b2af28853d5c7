"""The JSONL read by `vllm bench serve --dataset-name timed_trace` (timestamps in seconds, 16-token blocks)."""

from __future__ import annotations

from pathlib import Path

from harness.trace.importers.common import ImportOptions, ImportResult
from harness.trace.importers.length_jsonl import VLLM_TIMED, import_length_jsonl


def import_vllm_timed(path: Path, options: ImportOptions) -> ImportResult:
    return import_length_jsonl(path, options, VLLM_TIMED)
