"""env.json: what this run ran on (versions, GPUs, host, servers), written before the first request."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

from harness.atomic import atomic_path
from harness.experiment.config import ExperimentConfig
from harness.experiment.gpus import query_gpus
from harness.experiment.placement import Placement, placement_policy

REPO_ROOT = Path(__file__).resolve().parents[2]


def _git_sha() -> str | None:
    """The checkout's commit, with "-dirty" when it has uncommitted changes (None outside a git checkout)."""
    try:
        sha = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("-dirty" if dirty else "")


def _packages() -> dict[str, str]:
    return dict(
        sorted(
            (dist.metadata["Name"].lower(), dist.version)
            for dist in importlib.metadata.distributions()
            if dist.metadata["Name"]
        )
    )


def collect_environment(config: ExperimentConfig, argv: list[str]) -> dict[str, object]:
    """Everything about this machine and software that could explain a difference between runs."""
    gpus = query_gpus()
    try:
        version = importlib.metadata.version("replaybench")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {
        "replaybench_version": version,
        "git_sha": _git_sha(),
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": argv,
        "experiment": config.name,
        "mode": config.mode,
        "order": config.order,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "packages": _packages(),
        "gpus": [gpu.as_dict() for gpu in gpus] if gpus is not None else None,
        "gpu_note": None if gpus else "no GPU: embedded engine only",
        "servers": {},
        "placement": placement_policy(config),
    }


def write_environment(path: Path, environment: dict[str, object]) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(environment, indent=2, sort_keys=False) + "\n")


def record_server(path: Path, arm: str, info: dict[str, object]) -> None:
    """Add what a server said about itself (version, models) once it is up, still before its first request."""
    environment = json.loads(path.read_text())
    environment.setdefault("servers", {})[arm] = info
    write_environment(path, environment)


def record_placement(path: Path, config: ExperimentConfig, placed: Placement) -> None:
    """Add (or, for a re-run repeat, replace) the GPUs each arm gets in one repeat, as the repeat starts."""
    environment = json.loads(path.read_text()) if path.exists() else {}
    section = environment.setdefault("placement", placement_policy(config))
    section["repeats"] = [r for r in section.get("repeats", []) if r.get("repeat") != placed.repeat]
    section["repeats"].append(placed.as_dict())
    section["repeats"].sort(key=lambda r: r["repeat"])
    write_environment(path, environment)
