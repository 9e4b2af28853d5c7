"""Small real experiments for the tests: a tiny trace and configs whose arms run the embedded engine."""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

import pytest
import tomli_w

from harness.trace.model import Trace

REPO = Path(__file__).resolve().parents[2]
MODEL_CONFIG = str(REPO / "configs" / "models" / "nemotron-h-8b.json")


def tiny_trace(path: Path, requests: int = 6, spacing_s: float = 0.05, output_tokens: int = 8) -> Path:
    """`requests` short completions, `spacing_s` apart: a replay of it takes well under a second."""
    Trace.from_columns(
        {
            "request_id": [f"r{i}" for i in range(requests)],
            "arrival_s": [i * spacing_s for i in range(requests)],
            "api": ["completions"] * requests,
            "prompt_tokens": [32] * requests,
            "output_tokens": [output_tokens] * requests,
            "params": [json.dumps({"temperature": 0})] * requests,
        },
        {"source": "tests"},
    ).write(path)
    return path


def sim_command(policy: str, *extra: str) -> list[str]:
    return [
        "{python}",
        "-m",
        "harness.sim",
        "--policy",
        policy,
        "--model-config",
        MODEL_CONFIG,
        "--served-model-name",
        "m",
        "--port",
        "{port}",
        *extra,
    ]


def config_dict(trace: Path, **top: object) -> dict[str, object]:
    """A short A/B config on the embedded engine; keyword arguments replace top-level keys/tables."""
    document: dict[str, object] = {
        "name": "t",
        "repeats": 2,
        "order": "abba",
        "max_attempts": 2,
        "policy_change": ["--policy"],
        "trace": {"path": str(trace)},
        "replay": {"warmup_requests": 1},
        "arms": {
            "baseline": {"command": sim_command("baseline"), "startup_timeout_s": 60, "stop_grace_s": 5},
            "candidate": {"command": sim_command("replayssm"), "startup_timeout_s": 60, "stop_grace_s": 5},
        },
        "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
        "decision": {"lag_budget_s": 0.25, "receive_lag_budget_s": 0.25, "rate_tolerance": 0.5, "min_repeats": 2},
    }
    return document | top


def write_config(path: Path, document: dict[str, object]) -> Path:
    path.write_text(tomli_w.dumps(document))
    return path


def stand_in_nvml(watts: dict[int, float], monkeypatch: pytest.MonkeyPatch) -> None:
    """A `pynvml` (this box has no NVML library) whose GPU i has drawn `watts[i]` since the epoch of the monotonic
    clock (millijoules, whole); a GPU not in `watts` does not exist."""
    module = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(watts),
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetTotalEnergyConsumption=lambda gpu: int(watts[gpu] * time.monotonic() * 1e3),
    )
    monkeypatch.setitem(sys.modules, "pynvml", module)
