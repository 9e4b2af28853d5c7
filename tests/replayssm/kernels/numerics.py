"""Helpers both kernel test modules use: reproducible generators, batch layouts, the error their tolerances bound."""

from __future__ import annotations

import zlib

import torch


def seeded(*key: object) -> torch.Generator:
    """A generator seeded from the test's parameters (stable across processes, unlike hash())."""
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute error relative to the largest |expected| value: "fraction of the tensor's scale"."""
    scale = expected.abs().max().item()
    return (actual.double() - expected.double()).abs().max().item() / max(scale, 1e-30)


def layout_rows(batch: int, gen: torch.Generator, pad_slot_id: int) -> tuple[torch.Tensor, int]:
    """state_indices for a batch: a shuffled set of real slots, the last row padding; returns (indices, slots).

    With pad_slot_id 0 the cache's slot 0 is vLLM's null block: real rows never use it.
    """
    slots = batch + 2
    first_real = 1 if pad_slot_id == 0 else 0
    real = torch.randperm(slots - first_real, generator=gen)[: batch - 1] + first_real
    return torch.cat([real, torch.tensor([pad_slot_id])]).to(torch.int32), slots
