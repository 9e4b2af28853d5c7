"""Helpers for the simulated engine tests: a real `python -m harness.sim` subprocess and a tiny HTTP client."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.servers import CHILD_MARKER

REPO = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"listening on (http://\S+) ")


@dataclass
class SimProcess:
    process: subprocess.Popen[str]
    url: str
    log_lines: list[str] = field(default_factory=list)

    def stop(self) -> int:
        """SIGTERM the process group, SIGKILL if it lingers; returns the exit code."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        if self.process.stdout:
            self.log_lines += self.process.stdout.read().splitlines()
            self.process.stdout.close()
        return self.process.returncode


def start_sim(*args: str, mark_child: bool = True) -> SimProcess:
    """Start serve-sim on a free port (port 0; the process logs the one it got) and wait until it listens.

    `mark_child=False` hides it from the suite's after-every-test orphan check; only for a module-scoped
    server, which its fixture stops in a `finally`.
    """
    env = os.environ | {"PYTHONUNBUFFERED": "1"} | ({CHILD_MARKER: "1"} if mark_child else {})
    process = subprocess.Popen(
        [sys.executable, "-m", "harness.sim", "--port", "0", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    sim = SimProcess(process, url="")
    deadline = time.monotonic() + 60
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            sim.stop()
            raise AssertionError("serve-sim exited before listening:\n" + "\n".join(sim.log_lines))
        sim.log_lines.append(line.rstrip("\n"))
        if match := LISTENING.search(line):
            sim.url = match.group(1)
            return sim
    sim.stop()
    raise AssertionError("serve-sim did not start listening within 60 s")


def post_json(
    url: str, body: dict[str, Any], timeout: float = 30, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def get(url: str, timeout: float = 30) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def stream_events(url: str, body: dict[str, Any], timeout: float = 30) -> Iterator[dict[str, Any] | str]:
    """POST with stream=true and yield each SSE `data:` payload (parsed JSON, or the string "[DONE]")."""
    request = urllib.request.Request(
        url, data=json.dumps(body | {"stream": True}).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                yield data if data == "[DONE]" else json.loads(data)


def metric_value(text: str, name: str) -> float:
    """Value of the first sample whose name (labels stripped) is `name`."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key.split("{")[0] == name:
            return float(value)
    raise AssertionError(f"metric {name} not in /metrics")
