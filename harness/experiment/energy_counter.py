"""Each GPU's cumulative energy counter (NVML, through NVIDIA's own binding nvidia-ml-py), read beside a run.

Why: nvidia-smi's `power.draw` is a one-second average whose sensor, on A100 and H100, covers about a quarter of
the time ("Part-time Power Measurements: nvidia-smi's Lack of Attention", arXiv 2312.02741), so energy from it can
be off where the load changes faster than that. The driver's energy counter (millijoules since it loaded, Volta and
later) accumulates all of it: two reads bracket a window's energy exactly. Without NVML (a laptop, CI) or on a GPU
without the counter, the reason is kept and the power samples stand in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any


class EnergyCounters:
    """Open NVML handles of the GPUs to read; `error` says why there are none."""

    def __init__(self, gpus: Sequence[int]) -> None:
        """`gpus`: NVML indices (nvidia-smi's order); empty means every GPU, as nvidia-smi samples them."""
        self.handles: dict[int, Any] = {}
        self.error: str | None = None
        self._nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            indices = list(gpus) or list(range(pynvml.nvmlDeviceGetCount()))
            handles = {index: pynvml.nvmlDeviceGetHandleByIndex(index) for index in indices}
            for handle in handles.values():
                pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # a GPU before Volta has none
        except Exception as exc:  # no binding, no driver library, no such GPU: the power samples stand in
            self.error = f"NVML energy counter not read ({_named(exc)})"
            self.close()
            return
        self.handles = handles

    def read(self) -> dict[int, float]:
        """Millijoules each GPU has drawn since the driver loaded; empty (error set) when a read fails."""
        try:
            read = self._nvml.nvmlDeviceGetTotalEnergyConsumption
            return {index: float(read(handle)) for index, handle in self.handles.items()}
        except Exception as exc:
            self.error = f"NVML energy counter read failed ({_named(exc)})"
            return {}

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):  # a library that half-started: nothing left to release
                self._nvml.nvmlShutdown()
            self._nvml = None
        self.handles = {}


def _named(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}".strip().rstrip(":")
