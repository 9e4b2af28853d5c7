"""Which tensors a ReplaySSM Gated DeltaNet layer keeps per state block, in vLLM's MambaSpec terms.

As for Mamba-2 (``state_layout``), the layer spec and the model classmethods (which size the page) must
list the same extra tensors, so both call these two functions on vLLM's own (conv, ssm) entries. The ring
is the kernels' layout (``kernels.gdn_layout``): normalised keys [L, HK, K], corrected values [L, HV, V]
and log-decays [L, HV], all fp32 like the checkpoint, so every byte offset stays aligned.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replayssm_patch.config import ReplaySSMConfig
from replayssm_patch.kernels.gdn_layout import gdn_ring_shapes

# Index of each ring tensor in the layer's kv_cache list (vLLM's conv and ssm states are 0 and 1).
RING_K, RING_U, RING_G = 2, 3, 4


@dataclass(frozen=True)
class GdnDims:
    """Per-rank GDN sizes, read back from vLLM's own (conv, ssm) state shapes."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int

    @classmethod
    def from_state_shapes(cls, conv_shape: tuple[int, ...], ssm_shape: tuple[int, ...], dim_first: bool) -> GdnDims:
        num_v_heads, head_v_dim, head_k_dim = ssm_shape
        conv_dim = conv_shape[0] if dim_first else conv_shape[1]  # q and k (HK x K each), then v (HV x V)
        num_k_heads, rest = divmod(conv_dim - num_v_heads * head_v_dim, 2 * head_k_dim)
        if rest or num_k_heads < 1:
            raise ValueError(f"conv state {conv_shape} does not fit GDN ssm state {ssm_shape}")
        return cls(num_k_heads, num_v_heads, head_k_dim, head_v_dim)


def gdn_replay_state_shapes(
    stock: tuple[tuple[int, ...], ...], config: ReplaySSMConfig, dim_first: bool
) -> tuple[tuple[int, ...], ...]:
    """vLLM's (conv, ssm) shapes followed by ring_k, ring_u and ring_g for ``config.buffer_len`` steps."""
    dims = GdnDims.from_state_shapes(*stock, dim_first)
    ring = gdn_ring_shapes(dims.num_k_heads, dims.num_v_heads, dims.head_k_dim, dims.head_v_dim, config.buffer_len)
    return (*stock, ring.ring_k, ring.ring_u, ring.ring_g)


def gdn_replay_state_dtypes(stock: tuple[torch.dtype, ...]) -> tuple[torch.dtype, ...]:
    """dtypes matching ``gdn_replay_state_shapes``: the whole ring is fp32."""
    return (*stock, torch.float32, torch.float32, torch.float32)
