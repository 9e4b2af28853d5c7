"""Small builders shared by the replay tests: traces with known shape and a one-call replay."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa

from harness.records.result_io import read_results
from harness.replay import ReplayOptions, ReplayOutcome, run_replay
from harness.trace.model import Trace
from tests.support.openai_server import REPO_ROOT

FAST = {"request_timeout_s": 10.0, "read_timeout_s": 2.0}
CLI = [sys.executable, "-c", "import sys; from harness.cli import app; sys.argv[0] = 'replaybench'; app()"]


def make_trace(
    n: int = 6,
    gap_s: float = 0.02,
    api: str = "completions",
    prompt_tokens: int = 12,
    output_tokens: int = 4,
    **columns: Any,
) -> Trace:
    """`n` requests every `gap_s` seconds; extra keyword columns override (lists of length n)."""
    base: dict[str, Any] = {
        "request_id": [f"req-{i}" for i in range(n)],
        "arrival_s": [i * gap_s for i in range(n)],
        "api": [api] * n,
        "prompt_tokens": [prompt_tokens] * n,
        "output_tokens": [output_tokens] * n,
        "params": [json.dumps({"temperature": 0.0})] * n,
    }
    metadata = {"source": "unit-test", "block_size": str(columns.pop("block_size", 4))}
    return Trace.from_columns(base | columns, metadata)


def replay(trace: Trace, url: str, out: Path, **options: Any) -> tuple[ReplayOutcome, pa.Table, dict[str, str]]:
    outcome = run_replay(trace, url, ReplayOptions(**(FAST | options)), out, arm="a", repeat=3, progress=False)
    table, meta = read_results(outcome.path)
    return outcome, table, meta


def rows_by_id(table: pa.Table) -> dict[str, dict[str, Any]]:
    return {row["request_id"]: row for row in table.to_pylist()}


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run the real `replaybench` command line (exit codes and stderr are what a user sees)."""
    return subprocess.run([*CLI, *map(str, args)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)


def free_port_without_listener() -> int:
    """A loopback port nobody listens on (connections to it are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
