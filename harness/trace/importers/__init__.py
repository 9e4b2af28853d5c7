"""Importers: one module per source format, each `import_<format>(path, options) -> ImportResult`.

This registry is import-light (the CLI reads it at start-up); format modules load only when used.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.trace.importers.common import ImportOptions, ImportResult

# format name on the command line -> (module, function)
IMPORTERS: dict[str, tuple[str, str]] = {
    "azure": ("azure", "import_azure"),
    "burstgpt": ("burstgpt", "import_burstgpt"),
    "mooncake": ("mooncake", "import_mooncake"),
    "vllm-timed": ("vllm_timed", "import_vllm_timed"),
    "openai-jsonl": ("openai_jsonl", "import_openai_jsonl"),
}


def import_trace(fmt: str, path: str | Path, options: ImportOptions | None = None) -> ImportResult:
    """Import `path` in source format `fmt` (a key of `IMPORTERS`) into a validated trace."""
    from harness.trace.importers.common import ImportOptions

    module, function = IMPORTERS[fmt]
    importer = getattr(importlib.import_module(f"{__name__}.{module}"), function)
    return importer(Path(path), options or ImportOptions())
