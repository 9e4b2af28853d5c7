"""`make demo`: import the shipped Azure trace and show what it looks like (grows into a paired replay)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from harness.cli import app

SOURCE = Path(__file__).resolve().parents[1] / "traces/source/azure_2023/AzureLLMInferenceTrace_conv.csv"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "azure-conv-2023.parquet"
        app(["import", "azure", str(SOURCE), "-o", str(trace)], standalone_mode=False)
        app(["inspect", str(trace)], standalone_mode=False)


if __name__ == "__main__":
    main()
