"""Pieces both ReplaySSM kernels (and their PyTorch references) share: decay sums, softplus, launch checks."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def softplus_f32(dt):
    """Same formula as vLLM's selective_state_update, so the ring stores bit-identical dt."""
    return tl.where(dt <= 20.0, tl.log(tl.exp(dt) + 1.0), dt)


@triton.jit
def decay_sum_after(dt, offs_l):
    """For each ring entry s: the dt summed over LATER entries (s+1 .. end), without cumsum cancellation.

    exp(A * that) is the decay from step s to the last step; a direct masked [L, L] sum keeps full fp32
    relative precision even for the newest entries (total - cumsum would lose ~|A|*total*eps there).
    """
    later = offs_l[None, :] > offs_l[:, None]
    return tl.sum(tl.where(later, dt[None, :], 0.0), axis=1)


@triton.jit
def decay_sums_after(dt, offs_l):
    """``decay_sum_after`` of every row of a [rows, L] tile (one head per row), in one masked [rows, L, L] sum."""
    later = offs_l[None, :] > offs_l[:, None]
    return tl.sum(tl.where(later[None, :, :], dt[:, None, :], 0.0), axis=2)


def softplus_reference(dt: torch.Tensor) -> torch.Tensor:
    """PyTorch twin of ``softplus_f32``."""
    return torch.where(dt <= 20.0, torch.log(torch.exp(dt) + 1.0), dt)


def decay_sum_after_reference(dt: torch.Tensor, dim: int) -> torch.Tensor:
    """PyTorch twin of ``decay_sum_after`` along ``dim`` (reverse cumulative sum, shifted by one)."""
    suffix = dt.flip(dim).cumsum(dim).flip(dim)
    later = suffix.narrow(dim, 1, dt.shape[dim] - 1)
    return torch.cat([later, torch.zeros_like(dt.narrow(dim, 0, 1))], dim=dim)


def launchable_on(device: torch.device) -> bool:
    """Whether the Triton kernels can run on ``device``'s tensors: CUDA, or the CPU with TRITON_INTERPRET=1."""
    return device.type != "cpu" or os.environ.get("TRITON_INTERPRET") == "1"


def check_launchable(*tensors: torch.Tensor) -> None:
    """Triton needs CUDA tensors, or CPU tensors with TRITON_INTERPRET=1 set before triton was imported."""
    if not all(launchable_on(t.device) for t in tensors):
        raise RuntimeError(
            "ReplaySSM Triton kernels got CPU tensors; use CUDA tensors, or set TRITON_INTERPRET=1 "
            "before importing triton, or call the *_reference function instead"
        )


def block_size(n: int, cap: int | None = None, floor: int = 1) -> int:
    """Power-of-two block covering n (optionally capped), at least ``floor`` (tl.dot needs 16)."""
    size = triton.next_power_of_2(n)
    if cap is not None:
        size = min(size, triton.next_power_of_2(cap))
    return max(size, floor)


def head_chunk(heads_per_group: int) -> int:
    """Heads a coefficient launch handles as one tile: the largest power of two dividing the group, at most 16."""
    return min(16, heads_per_group & -heads_per_group)


def register_cap(maxnreg: int) -> dict[str, int]:
    """Triton's launch option capping a kernel's registers per thread (ptxas ``.maxnreg``), none for 0."""
    return {"maxnreg": maxnreg} if maxnreg else {}
