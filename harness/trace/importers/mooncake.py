"""Mooncake/Kimi traces (kvcache-ai/Mooncake): timestamps in ms, `hash_ids` of 512-token blocks."""

from __future__ import annotations

from pathlib import Path

from harness.trace.importers.common import ImportOptions, ImportResult
from harness.trace.importers.length_jsonl import MOONCAKE, import_length_jsonl


def import_mooncake(path: Path, options: ImportOptions) -> ImportResult:
    return import_length_jsonl(path, options, MOONCAKE)
