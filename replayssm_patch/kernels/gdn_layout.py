"""Cache layout of ReplaySSM for Gated DeltaNet (GDN) layers, and the rule that the checkpoint is fp32.

Per slot (vLLM's state index of a sequence), any strides allowed (views into vLLM's KV-cache pages):
    ssm_state  [slots, num_v_heads, head_v_dim, head_k_dim]  fp32  checkpoint S_c: vLLM's own GDN state
    ring_k     [slots, L, num_k_heads, head_k_dim]           fp32  normalised keys k̂ (one per KEY head)
    ring_u     [slots, L, num_v_heads, head_v_dim]           fp32  corrected values u = β (v − e^g S k̂)
    ring_g     [slots, L, num_v_heads]                       fp32  log-decays g = −e^A_log softplus(a + dt_bias)
Everything is fp32: u and k̂ are folded into the fp32 checkpoint, so a rounded copy of either would move the
state off the baseline trajectory. k̂ is kept normalised (not raw k) so no kernel recomputes norms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from replayssm_patch.config import SPLIT_PRECISION_REFUSED
from replayssm_patch.kernels.layout import PAD_SLOT_ID

__all__ = [
    "PAD_SLOT_ID",
    "GdnReplayCache",
    "GdnRingShapes",
    "gdn_ring_shapes",
    "require_fp32_checkpoint",
    "split_packed_qkv",
]

# Why a split-precision (bf16/fp16 copy) checkpoint is refused for GDN, unlike Mamba-2: u is computed from the
# state it reads, so folding u computed against a rounded copy C of the master M gives f(C) + e^G (M − C), not
# f(M): the copy's rounding re-enters the master at every flush and the state leaves the fp32 trajectory.


def require_fp32_checkpoint(ssm_state: torch.Tensor) -> None:
    """Refuse a GDN checkpoint that is not fp32 (a bf16 state would round u's fold and the decayed state)."""
    if ssm_state.dtype != torch.float32:
        dtype = str(ssm_state.dtype).removeprefix("torch.")
        raise ValueError(
            f"ReplaySSM for Gated DeltaNet needs an fp32 SSM state, got {dtype}; "
            "start vLLM with --mamba-ssm-cache-dtype float32"
        )


def split_packed_qkv(
    qkv: torch.Tensor, num_k_heads: int, head_k_dim: int, num_v_heads: int, head_v_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k [rows, num_k_heads, head_k_dim] and v [rows, num_v_heads, head_v_dim] as views of a [rows, q|k|v]
    tensor, the channel order vLLM's GDN layer packs (its causal conv runs over all of them)."""
    keys = num_k_heads * head_k_dim
    q, k, v = torch.split(qkv, [keys, keys, num_v_heads * head_v_dim], -1)
    return (q.unflatten(-1, (num_k_heads, head_k_dim)), k.unflatten(-1, (num_k_heads, head_k_dim)),
            v.unflatten(-1, (num_v_heads, head_v_dim)))  # fmt: skip


@dataclass(frozen=True)
class GdnRingShapes:
    """Per-slot shapes of the ring tensors one GDN layer needs (no slot dimension); all fp32."""

    ring_k: tuple[int, int, int]  # (L, num_k_heads, head_k_dim)
    ring_u: tuple[int, int, int]  # (L, num_v_heads, head_v_dim)
    ring_g: tuple[int, int]  # (L, num_v_heads)
    dtype: torch.dtype = torch.float32

    def nbytes(self) -> int:
        """Bytes per slot of the ring, for page-size bookkeeping."""
        return 4 * sum(math.prod(shape) for shape in (self.ring_k, self.ring_u, self.ring_g))


def gdn_ring_shapes(
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    buffer_len: int,
    split_precision: bool = False,
) -> GdnRingShapes:
    """Ring shapes for ``buffer_len`` steps; ``split_precision`` is refused (see SPLIT_PRECISION_REFUSED)."""
    if split_precision:
        raise ValueError(SPLIT_PRECISION_REFUSED)
    if buffer_len < 1:
        raise ValueError(f"buffer_len must be >= 1, got {buffer_len}")
    if num_v_heads % num_k_heads:
        raise ValueError(f"num_v_heads ({num_v_heads}) must be a multiple of num_k_heads ({num_k_heads})")
    return GdnRingShapes(
        ring_k=(buffer_len, num_k_heads, head_k_dim),
        ring_u=(buffer_len, num_v_heads, head_v_dim),
        ring_g=(buffer_len, num_v_heads),
    )


@dataclass
class GdnReplayCache:
    """Dense GDN ReplaySSM tensors of one layer for ``slots`` sequences (tests and benchmarks; inside vLLM the
    same tensors are views into the KV-cache pages)."""

    ssm_state: torch.Tensor  # [slots, num_v_heads, head_v_dim, head_k_dim] fp32 checkpoint
    ring_k: torch.Tensor  # [slots, L, num_k_heads, head_k_dim]
    ring_u: torch.Tensor  # [slots, L, num_v_heads, head_v_dim]
    ring_g: torch.Tensor  # [slots, L, num_v_heads]

    @classmethod
    def allocate(
        cls, slots: int, spec: GdnRingShapes, *, device: torch.device | str = "cpu", ring_fill: float = 0.0
    ) -> GdnReplayCache:
        """Zero checkpoints; rings filled with ``ring_fill`` (NaN simulates a reused slot's stale entries)."""
        num_v_heads, head_v_dim = spec.ring_u[1:]
        head_k_dim = spec.ring_k[2]

        def ring(shape: tuple[int, ...]) -> torch.Tensor:
            return torch.full((slots, *shape), ring_fill, dtype=spec.dtype, device=device)

        state = torch.zeros(slots, num_v_heads, head_v_dim, head_k_dim, dtype=torch.float32, device=device)
        return cls(ssm_state=state, ring_k=ring(spec.ring_k), ring_u=ring(spec.ring_u), ring_g=ring(spec.ring_g))

    def clone(self) -> GdnReplayCache:
        return GdnReplayCache(self.ssm_state.clone(), self.ring_k.clone(), self.ring_u.clone(), self.ring_g.clone())

    @property
    def ring_len(self) -> int:
        return self.ring_g.shape[1]
