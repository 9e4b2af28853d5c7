"""The GPU benchmark's --smoke run and the Hopper compile check, both on CPU, as a user would start them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def run_module(module: str, *args: str, interpret: bool, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run `python -m module args` in its own process group; kill the whole group if it overruns."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args], cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{module} overran {timeout} s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def test_kernel_bench_smoke_runs_on_cpu(tmp_path: Path) -> None:
    done = run_module("replayssm_patch.gpu.kernel_bench", "--smoke", "--out", str(tmp_path), interpret=False)
    assert done.returncode == 0, done.stdout
    data = json.loads((tmp_path / "kernel_bench.json").read_text())
    assert "fp64 reference" in data["meta"]["baseline"], "without vLLM the fp64 fallback must be named"
    eq = data["equivalence"]
    assert eq["status"] == "ok", eq.get("traceback")
    assert eq["fp32"]["finite"] and eq["split"]["finite"]
    assert eq["fp32"]["max_rel_err"] <= 2e-5 and eq["fp32"]["final_state_rel_err"] <= 2e-5
    assert 1e-4 < eq["split"]["max_rel_err"] <= 2e-2, "split precision must show (bounded) bf16 error"
    assert eq["split"]["final_state_rel_err"] <= 2e-5, "the fp32 master must not drift in split precision"
    timing = data["timing"]
    assert timing["status"] == "ok", timing.get("traceback")
    kernels = {row["kernel"] for row in timing["rows"]}
    assert {"replay fp32", "replay split", "decode step fp32 (replay + 1/L flush)"} <= kernels
    markdown = (tmp_path / "kernel_bench.md").read_text()
    assert "| fp32 |" in markdown and "| batch | kernel | us |" in markdown


def test_kernel_bench_without_gpu_or_smoke_refuses(tmp_path: Path) -> None:
    done = run_module("replayssm_patch.gpu.kernel_bench", "--out", str(tmp_path), interpret=False, timeout=60)
    assert done.returncode == 2
    assert done.stdout.strip().splitlines()[-1].startswith("error: no CUDA GPU")


def test_kernels_compile_for_hopper() -> None:
    """The real Triton compiler (not the interpreter) accepts every default kernel variant for sm_90."""
    done = run_module("replayssm_patch.kernels.compile_check", interpret=False)
    assert done.returncode == 0, done.stdout
    assert done.stdout.count(": ok") == 4
