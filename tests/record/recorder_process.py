"""Run `replaybench record` as a real subprocess (own process group) for the tests; always stopped."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.openai_server import stop_process_group

_SCRIPT = Path(sys.executable).parent / "replaybench"
# The console script of this venv; where there is none (a bare host running the benchmark), the same app via -c.
REPLAYBENCH = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-c", "from harness.cli import app; app()"]
_LISTENING = re.compile(r"listening on (http://\S+) ->")


@dataclass
class Recorder:
    url: str
    proc: subprocess.Popen
    stdout: Path
    stderr: Path

    def stop(self) -> int:
        """SIGTERM (graceful: drain, write the last part) and wait; returns the exit code."""
        os.killpg(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def kill9(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    @property
    def output(self) -> str:
        return self.stdout.read_text() + self.stderr.read_text()


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*REPLAYBENCH, *args], capture_output=True, text=True, timeout=timeout)


@contextlib.contextmanager
def recorder(
    upstream_url: str,
    output: Path,
    *args: str,
    logs: Path,
    listen: str = "127.0.0.1:0",
    preexec: Callable[[], None] | None = None,
) -> Iterator[Recorder]:
    """Start `replaybench record --upstream URL --listen LISTEN -o OUTPUT ARGS`; yield once it listens. One worker
    unless ARGS say otherwise: `--workers auto` depends on the host's cores, and so would the part names."""
    logs.mkdir(parents=True, exist_ok=True)
    stdout, stderr = logs / "recorder.stdout", logs / "recorder.stderr"
    pinned = () if "--workers" in args else ("--workers", "1")
    cmd = [*REPLAYBENCH, "record", "--upstream", upstream_url, "--listen", listen, "-o", str(output), *pinned, *args]
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True, preexec_fn=preexec)
    try:
        deadline = time.monotonic() + 30
        while not (match := _LISTENING.search(stdout.read_text())):
            if proc.poll() is not None:
                raise RuntimeError(f"recorder exited early ({proc.returncode}): {stderr.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("recorder did not start listening in time")
            time.sleep(0.02)
        yield Recorder(match.group(1), proc, stdout, stderr)
    finally:
        if proc.poll() is None:
            stop_process_group(proc, grace_s=30)
