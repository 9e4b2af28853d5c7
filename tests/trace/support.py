"""Paths of the shipped real sources and small writers for hand-made sources used by the trace tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
AZURE_CONV = REPO / "traces/source/azure_2023/AzureLLMInferenceTrace_conv.csv"
AZURE_CODE = REPO / "traces/source/azure_2023/AzureLLMInferenceTrace_code.csv"
BURSTGPT = REPO / "traces/source/burstgpt/BurstGPT_1_first400.csv"


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def write_jsonl(path: Path, objects: list[dict]) -> Path:
    return write_lines(path, [json.dumps(obj) for obj in objects])


def replaybench(*args: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run the real `replaybench` command line in a subprocess (so exit codes and stderr are the user's)."""
    code = "import sys; from harness.cli import app; sys.argv[0] = 'replaybench'; app()"
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
