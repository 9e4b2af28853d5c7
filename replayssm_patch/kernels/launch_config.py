"""Launch shape of the replay-step kernel per checkpoint dtype: the defaults, or a GPU's measured best.

The kernel bench sweeps (block_p, block_n, num_warps) on the GPU and writes the fastest per dtype to a JSON
file; ``REPLAYSSM_LAUNCH_CONFIG=<file>`` makes the plugin use it (as vLLM reads its tuned kernel configs),
and the H200's committed file (``launch_h200.json`` beside this module) is used on an H200 without it.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

ENV_VAR = "REPLAYSSM_LAUNCH_CONFIG"
COMMITTED = {"H200": Path(__file__).with_name("launch_h200.json")}


@dataclass(frozen=True)
class ReplayLaunch:
    block_p: int = 16
    block_n: int = 64
    num_warps: int = 1

    def as_key(self) -> str:
        return f"{self.block_p}x{self.block_n}x{self.num_warps}w"


DEFAULT = ReplayLaunch()


@functools.cache  # every layer launch asks: read the table once per (dtype, device), not per launch
def launch_for(state_dtype: torch.dtype, device: torch.device) -> ReplayLaunch:
    """The tuned shape for a checkpoint of ``state_dtype`` ("fp32" or "split" entry), else the default."""
    entry = "split" if state_dtype.itemsize <= 2 else "fp32"
    table = _tuned_table(_device_name(device))
    return ReplayLaunch(**table[entry]) if entry in table else DEFAULT


def launch_shapes_in_use(device_name: str) -> dict[str, str]:
    """Which replay launch shapes a process on ``device_name`` uses and where they come from, for result rows:
    a kernel figure is only comparable with the shapes it ran."""
    table = _tuned_table(device_name)
    shapes = {entry: ReplayLaunch(**table.get(entry, {})).as_key() for entry in ("fp32", "split")}
    return {"source": _table_path(device_name) or "defaults", **shapes}


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _table_path(device_name: str) -> str | None:
    """REPLAYSSM_LAUNCH_CONFIG, else the committed file of this GPU model, else None (the defaults)."""
    found = [str(file) for key, file in COMMITTED.items() if key in device_name and file.exists()]
    return os.environ.get(ENV_VAR) or (found[0] if found else None)


def _tuned_table(device_name: str) -> dict[str, dict[str, int]]:
    path = _table_path(device_name)
    return json.loads(Path(path).read_text())["replay_step"] if path else {}
