"""Exporters: write a trace in another tool's format so the same workload can be cross-checked there."""

from __future__ import annotations

from harness.trace.exporters.length_jsonl import ExportResult, export_length_jsonl
from harness.trace.importers.length_jsonl import MOONCAKE, VLLM_TIMED

EXPORT_FORMATS = {"mooncake": MOONCAKE, "vllm-timed": VLLM_TIMED}

__all__ = ["EXPORT_FORMATS", "ExportResult", "export_length_jsonl"]
