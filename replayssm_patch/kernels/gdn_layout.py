"""Cache layout of ReplaySSM for Gated DeltaNet (GDN) layers, and the rule that the checkpoint is fp32.

Per slot (vLLM's state index of a sequence), any strides allowed (views into vLLM's KV-cache pages):
    ssm_state  [slots, num_v_heads, head_v_dim, head_k_dim]  fp32  checkpoint S_c: vLLM's own GDN state
    ring_k     [slots, L, num_k_heads, head_k_dim]           fp32  normalised keys k̂ (one per KEY head)
    ring_u     [slots, L, num_v_heads, head_v_dim]           fp32  corrected values u = β (v − e^g S k̂)
    ring_g     [slots, L, num_v_heads]                       fp32  log-decays g = −e^A_log softplus(a + dt_bias)
With split precision (``GdnSplitTensors``) also:
    state_bf16 [slots, num_v_heads, head_v_dim, head_k_dim]  bf16  the copy the replay reads instead of S_c
    ring_beta  [slots, L, num_v_heads]                       fp32  write strengths β
    ring_v     [slots, L, num_v_heads, head_v_dim]     model dtype  raw post-conv values v (lossless)
u and k̂ are folded into the fp32 checkpoint, so a rounded copy of either would move the state off the baseline
trajectory; k̂ is kept normalised (not raw k) so no kernel recomputes norms.

Why split precision keeps β and raw v: u is computed from the state it reads, so a u computed against the
rounded copy C of the master M, folded, gives f(C) + e^G (M − C), not f(M): the copy's rounding would enter
the master at every flush. Instead a split row's flush replays its window exactly, one step at a time on the
fp32 master from (k̂, v, β, g) (``gdn_common.replay_exact``); the copy's u only answers the window's outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from replayssm_patch.kernels.layout import PAD_SLOT_ID

__all__ = [
    "PAD_SLOT_ID",
    "GdnReplayCache",
    "GdnRingShapes",
    "GdnSplitTensors",
    "gdn_ring_shapes",
    "require_fp32_checkpoint",
    "split_kernel_tensors",
    "split_packed_qkv",
]


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
    """Per-slot shapes of the ring tensors one GDN layer needs (no slot dimension): fp32 but ring_v (the model's
    dtype) and state_bf16; the split-precision ones None without it."""

    ring_k: tuple[int, int, int]  # (L, num_k_heads, head_k_dim)
    ring_u: tuple[int, int, int]  # (L, num_v_heads, head_v_dim)
    ring_g: tuple[int, int]  # (L, num_v_heads)
    ring_beta: tuple[int, int] | None = None  # (L, num_v_heads)
    ring_v: tuple[int, int, int] | None = None  # (L, num_v_heads, head_v_dim)
    state_bf16: tuple[int, int, int] | None = None  # (num_v_heads, head_v_dim, head_k_dim)

    @property
    def split_precision(self) -> bool:
        return self.state_bf16 is not None

    def nbytes(self, model_dtype: torch.dtype) -> int:
        """Bytes per slot of the ring (and the split tensors), for page-size bookkeeping."""
        total = 4 * sum(math.prod(shape) for shape in (self.ring_k, self.ring_u, self.ring_g))
        if self.ring_beta is not None and self.ring_v is not None and self.state_bf16 is not None:
            item = torch.empty((), dtype=model_dtype).element_size()
            total += 4 * math.prod(self.ring_beta) + item * math.prod(self.ring_v) + 2 * math.prod(self.state_bf16)
        return total


def gdn_ring_shapes(
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    buffer_len: int,
    split_precision: bool = False,
) -> GdnRingShapes:
    """Ring shapes for ``buffer_len`` steps, and with ``split_precision`` the bf16 copy, β and raw v rings."""
    if buffer_len < 1:
        raise ValueError(f"buffer_len must be >= 1, got {buffer_len}")
    if num_v_heads % num_k_heads:
        raise ValueError(f"num_v_heads ({num_v_heads}) must be a multiple of num_k_heads ({num_k_heads})")
    split = {}
    if split_precision:
        split = {
            "ring_beta": (buffer_len, num_v_heads),
            "ring_v": (buffer_len, num_v_heads, head_v_dim),
            "state_bf16": (num_v_heads, head_v_dim, head_k_dim),
        }
    return GdnRingShapes(
        ring_k=(buffer_len, num_k_heads, head_k_dim),
        ring_u=(buffer_len, num_v_heads, head_v_dim),
        ring_g=(buffer_len, num_v_heads),
        **split,
    )


@dataclass
class GdnSplitTensors:
    """What split precision adds to a GDN layer's cache (``gdn_layout``'s docstring says why each is there)."""

    state_bf16: torch.Tensor  # [slots, num_v_heads, head_v_dim, head_k_dim] bf16 copy the replay reads
    ring_beta: torch.Tensor  # [slots, L, num_v_heads] fp32
    ring_v: torch.Tensor  # [slots, L, num_v_heads, head_v_dim] model dtype

    def clone(self) -> GdnSplitTensors:
        return GdnSplitTensors(self.state_bf16.clone(), self.ring_beta.clone(), self.ring_v.clone())


def split_kernel_tensors(
    split: GdnSplitTensors | None, ssm_state: torch.Tensor, ring_u: torch.Tensor, ring_g: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(copy, ring_v, ring_beta) as a kernel's pointer arguments: split precision's, or without it stand-ins of the
    same rank, which a kernel compiled with SPLIT off never touches."""
    if split is None:
        return ssm_state, ring_u, ring_g
    return split.state_bf16, split.ring_v, split.ring_beta


@dataclass
class GdnReplayCache:
    """Dense GDN ReplaySSM tensors of one layer for ``slots`` sequences (tests and benchmarks; inside vLLM the
    same tensors are views into the KV-cache pages)."""

    ssm_state: torch.Tensor  # [slots, num_v_heads, head_v_dim, head_k_dim] fp32 checkpoint
    ring_k: torch.Tensor  # [slots, L, num_k_heads, head_k_dim]
    ring_u: torch.Tensor  # [slots, L, num_v_heads, head_v_dim]
    ring_g: torch.Tensor  # [slots, L, num_v_heads]
    split: GdnSplitTensors | None = None

    @classmethod
    def allocate(
        cls,
        slots: int,
        spec: GdnRingShapes,
        *,
        model_dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        ring_fill: float = 0.0,
    ) -> GdnReplayCache:
        """Zero checkpoints (and copies); rings filled with ``ring_fill`` (NaN simulates a reused slot's stale
        entries); ring_v in ``model_dtype``."""

        def ring(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.full((slots, *shape), ring_fill, dtype=dtype, device=device)

        num_v_heads, head_v_dim = spec.ring_u[1:]
        state = torch.zeros(slots, num_v_heads, head_v_dim, spec.ring_k[2], dtype=torch.float32, device=device)
        split = None
        if spec.ring_beta is not None and spec.ring_v is not None:
            copy = torch.zeros_like(state, dtype=torch.bfloat16)
            split = GdnSplitTensors(copy, ring(spec.ring_beta), ring(spec.ring_v, model_dtype))
        return cls(state, ring(spec.ring_k), ring(spec.ring_u), ring(spec.ring_g), split)

    def clone(self) -> GdnReplayCache:
        split = None if self.split is None else self.split.clone()
        return GdnReplayCache(
            self.ssm_state.clone(), self.ring_k.clone(), self.ring_u.clone(), self.ring_g.clone(), split
        )

    def set_checkpoint(self, slots: torch.Tensor, state: torch.Tensor) -> None:
        """Write checkpoints (as a prefill would) and their bf16 copies."""
        self.ssm_state[slots.long()] = state.to(self.ssm_state.dtype)
        if self.split is not None:
            self.split.state_bf16[slots.long()] = state.to(torch.bfloat16)

    @property
    def ring_len(self) -> int:
        return self.ring_g.shape[1]
