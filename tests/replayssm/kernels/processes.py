"""The kernel tests' child processes: a module as a user starts it, or a snippet through Triton's real compiler."""

from __future__ import annotations

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


def run_compiled(code: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code`` with TRITON_INTERPRET unset (Triton's compiler, not the interpreter; these tests' own
    process interprets), stdout and stderr apart; fails the test if it does not exit 0."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done
