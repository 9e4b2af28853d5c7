"""Host time of a step's GDN metadata (every KV-cache group's), vLLM's builder against ReplaySSM's, on this CPU.

The builders are vLLM 0.24's own (its CPU venv, tools/vllm_venv.sh), over a paged cache of Qwen3.5-4B's shapes:
64 decode rows, and every third step a fresh 1,024-token prefill beside them (the churn rows' mix). The timing
script is bench/builder_host_cost.py; why it matters is in its docstring.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench.report import write_results
from bench.vllm_venv import vllm_python
from replayssm_patch.plugin_site import plugin_pythonpath

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "tests" / "replayssm" / "integration" / "qwen3_5_4b_config.json"  # the H200 runs' shape


def write_venv_rows(benchmark: str, script: str, config: Path, title: str, notes: str) -> None:
    """Commit the table of the rows ``bench/<script>`` writes when run in vLLM's CPU venv on a model dir holding
    ``config``."""
    python, why = vllm_python()
    if python is None:
        raise SystemExit(f"error: {benchmark} needs vLLM's CPU venv: {why}")
    with tempfile.TemporaryDirectory() as tmp:
        model, out = Path(tmp) / "model", Path(tmp) / "rows.json"
        model.mkdir()
        shutil.copy(config, model / "config.json")
        env = {**os.environ, "PYTHONPATH": plugin_pythonpath(Path(tmp) / "site"),
               "VLLM_CACHE_ROOT": str(Path(tmp) / "cache"), "VLLM_LOGGING_LEVEL": "ERROR"}  # fmt: skip
        env.pop("VLLM_PLUGINS", None)
        subprocess.run([str(python), str(REPO / "bench" / script), str(model), str(out)], env=env, check=True,
                       timeout=900)  # fmt: skip
        rows = json.loads(out.read_text())
    write_results(benchmark, title, rows, notes)


def main() -> None:
    notes = (
        "µs per step for the metadata of Qwen3.5-4B's 3 GDN KV-cache groups, made as vLLM 0.24's model runner makes "
        "it (the first group's `build()`, then `update_block_table` for the others where the builder offers it, "
        "else a `build()` each), median of 5 rounds of 300 steps (every third mixed: 64 decode rows and a fresh "
        "1,024-token prefill; the others 64 decode rows). vLLM's real builders on the CPU: ReplaySSM's cursor plans "
        "run their PyTorch twins here, one Triton launch each on a GPU, so these are this CPU's figures for "
        "comparing the builders, not the H200's. Single-threaded torch."
    )
    title = "GDN metadata build: host µs per step, vLLM vs ReplaySSM"
    write_venv_rows("bench_builder", "builder_host_cost.py", CONFIG, title, notes)
