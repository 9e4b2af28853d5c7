"""Running this folder's check scripts inside the vllm==0.24.0 CPU venv, shared by the test_vllm_*.py files.

A check script runs in that venv with this checkout on PYTHONPATH plus a dist-info holding the entry point
pyproject.toml declares (replayssm_patch.plugin_site, also used on the GPU host) and writes one JSON object,
which the tests assert on. The venv itself comes from the session-scoped ``vllm_python`` fixture (conftest.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from replayssm_patch.plugin_site import plugin_pythonpath

# The first test of a session builds the cached venv (about a minute, longer on a busy machine) inside its fixture.
VLLM_VENV_MARKS = [pytest.mark.vllm, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent


def run_with_timeout(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own process group; past ``timeout`` kill the whole group and fail the test."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{cmd[0]} timed out after {timeout}s: {err[-2000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_check(python: Path, root: Path, script: str, configs: list[str], **env_extra: str) -> dict:
    """Run ``script`` in the vllm venv on model dirs made from ``configs``; return the JSON it writes."""
    models = []
    for name in configs:
        (root / name).mkdir()
        shutil.copy(HERE / f"{name}_config.json", root / name / "config.json")
        models.append(str(root / name))
    result = root / "result.json"
    pythonpath = f"{plugin_pythonpath(root / 'site')}{os.pathsep}{HERE}"
    env = {**os.environ, "PYTHONPATH": pythonpath, "VLLM_CACHE_ROOT": str(root / "cache"),
           "VLLM_LOGGING_LEVEL": "WARNING", **env_extra}  # fmt: skip
    env.pop("VLLM_PLUGINS", None)
    ran = run_with_timeout([str(python), str(HERE / script), *models, str(result)], 600, env)
    assert ran.returncode == 0 and result.exists(), f"{script} failed:\n{ran.stdout[-3000:]}{ran.stderr[-3000:]}"
    return json.loads(result.read_text())
