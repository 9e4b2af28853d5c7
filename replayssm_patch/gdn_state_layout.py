"""Which tensors a ReplaySSM Gated DeltaNet layer keeps per state block, in vLLM's MambaSpec terms.

As for Mamba-2 (``state_layout``), the layer spec and the model classmethods (which size the page) must
list the same extra tensors, so both call these two functions on vLLM's own (conv, ssm) entries. The ring
is the kernels' layout (``kernels.gdn_layout``): normalised keys [L, HK, K], corrected values [L, HV, V]
and log-decays [L, HV], all fp32 like the checkpoint; with split precision then β [L, HV] (fp32), the raw values
[L, HV, V] in the model dtype and the bf16 checkpoint copy [HV, V, K], the 16-bit ones last so every fp32 tensor's
byte offset stays 4-aligned.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replayssm_patch.config import ReplaySSMConfig
from replayssm_patch.kernels.gdn_layout import gdn_ring_shapes

# Index of each ring tensor in the layer's kv_cache list (vLLM's conv and ssm states are 0 and 1); the last three
# with split precision only.
RING_K, RING_U, RING_G, RING_BETA, RING_V, STATE_BF16 = 2, 3, 4, 5, 6, 7


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
    """vLLM's (conv, ssm) shapes followed by ring_k, ring_u and ring_g for ``config.buffer_len`` steps (and with
    split precision ring_beta, ring_v and the bf16 copy)."""
    dims = GdnDims.from_state_shapes(*stock, dim_first)
    ring = gdn_ring_shapes(
        dims.num_k_heads, dims.num_v_heads, dims.head_k_dim, dims.head_v_dim, config.buffer_len,
        config.split_precision,
    )  # fmt: skip
    split = (ring.ring_beta, ring.ring_v, ring.state_bf16) if config.split_precision else ()
    return (*stock, ring.ring_k, ring.ring_u, ring.ring_g, *split)


def gdn_replay_state_dtypes(
    stock: tuple[torch.dtype, ...], model_dtype: torch.dtype, config: ReplaySSMConfig
) -> tuple[torch.dtype, ...]:
    """dtypes matching ``gdn_replay_state_shapes``: an fp32 ring, then split precision's fp32 β, raw values in the
    model dtype (lossless) and bf16 copy."""
    split = (torch.float32, model_dtype, torch.bfloat16) if config.split_precision else ()
    return (*stock, torch.float32, torch.float32, torch.float32, *split)
