"""GPUs visible on this host, from nvidia-smi (absent on a CPU box: the embedded engine is all there is)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import asdict, dataclass

_QUERY = "index,name,memory.total,driver_version,uuid"


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_mib: int
    driver: str
    uuid: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def query_gpus() -> list[GpuInfo] | None:
    """Every GPU nvidia-smi lists, or None when there is no nvidia-smi (or it fails: no usable GPU)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={_QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = []
    for line in out.strip().splitlines():
        index, name, memory, driver, uuid = (field.strip() for field in line.split(","))
        gpus.append(GpuInfo(int(index), name, int(float(memory)), driver, uuid))
    return gpus
