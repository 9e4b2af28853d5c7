"""The GPUs the simulated engine can pretend to be: the three numbers a roofline needs, from vendor data sheets.

Bandwidth and dense bf16 tensor throughput (no sparsity) are the published peaks; memory is what
`nvidia-smi` reports (MiB), because that is what a server can allocate from; the interconnect is NVLink
(SXM parts) or PCIe Gen4 x16, used only for tensor-parallel all-reduces. The calibration's efficiency
factors (fitted on an H200) are applied unchanged to the others: a first-order what-if, not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.errors import UserError

MIB = 1 << 20


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_bandwidth: float  # bytes/s
    bf16_flops: float  # dense FLOP/s
    memory_bytes: int
    interconnect_bandwidth: float  # bytes/s per direction between GPUs of one host (NVLink, else PCIe)


GPUS: dict[str, Gpu] = {
    "h200": Gpu("NVIDIA H200 SXM 141GB", 4.8e12, 989e12, 143771 * MIB, 450e9),
    "h100": Gpu("NVIDIA H100 SXM 80GB", 3.35e12, 989e12, 81559 * MIB, 450e9),
    "a100": Gpu("NVIDIA A100 SXM 80GB", 2.039e12, 312e12, 81920 * MIB, 300e9),
    "l40s": Gpu("NVIDIA L40S 48GB", 0.864e12, 362e12, 46068 * MIB, 32e9),
    "rtx4090": Gpu("NVIDIA GeForce RTX 4090 24GB", 1.008e12, 165e12, 24564 * MIB, 32e9),
}


def get_gpu(name: str) -> Gpu:
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise UserError(f"unknown --gpu {name!r}; choose one of {', '.join(GPUS)}") from None
