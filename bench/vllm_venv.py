"""The cached CPU venv holding vllm==0.24.0 (tools/vllm_venv.sh), for the benchmarks that run vLLM's own code."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def vllm_python() -> tuple[Path | None, str]:
    """The vLLM venv's python (built by tools/vllm_venv.sh), or None and why not."""
    script = REPO / "tools" / "vllm_venv.sh"
    if not script.exists():
        return None, "tools/vllm_venv.sh does not exist"
    built = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=1800)
    lines = built.stdout.strip().splitlines()
    if built.returncode != 0 or not lines:
        return None, f"tools/vllm_venv.sh failed: {built.stderr.strip()[-300:]}"
    return Path(lines[-1]) / "bin" / "python", ""
