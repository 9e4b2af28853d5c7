"""Importers: one module per source format, each `import_<format>(path, options) -> ImportResult`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from harness.trace.importers.common import ImportOptions, ImportResult

# format name on the command line -> (module, function); modules load only when used.
IMPORTERS: dict[str, tuple[str, str]] = {
    "azure": ("azure", "import_azure"),
    "burstgpt": ("burstgpt", "import_burstgpt"),
    "mooncake": ("mooncake", "import_mooncake"),
    "vllm-timed": ("vllm_timed", "import_vllm_timed"),
    "openai-jsonl": ("openai_jsonl", "import_openai_jsonl"),
}

Importer = Callable[[Path, ImportOptions], ImportResult]


def importer(fmt: str) -> Importer:
    module, function = IMPORTERS[fmt]
    return getattr(importlib.import_module(f"{__name__}.{module}"), function)


def import_trace(fmt: str, path: Path, options: ImportOptions | None = None) -> ImportResult:
    """Import `path` in source format `fmt` into a validated trace."""
    return importer(fmt)(Path(path), options or ImportOptions())
