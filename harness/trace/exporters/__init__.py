"""Exporters: write a trace in another tool's format so the same workload can be cross-checked there.

Import-light like the importer registry: the CLI reads `EXPORT_FORMATS` at start-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.trace.exporters.length_jsonl import ExportResult
    from harness.trace.model import Trace

EXPORT_FORMATS = ("mooncake", "vllm-timed")


def export_trace(trace: Trace, path: str | Path, fmt: str) -> ExportResult:
    """Write `trace` to `path` in format `fmt` (one of `EXPORT_FORMATS`)."""
    from harness.trace.exporters.length_jsonl import export_length_jsonl
    from harness.trace.importers.length_jsonl import MOONCAKE, VLLM_TIMED

    return export_length_jsonl(trace, Path(path), {"mooncake": MOONCAKE, "vllm-timed": VLLM_TIMED}[fmt])
