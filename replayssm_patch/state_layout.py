"""Which tensors a ReplaySSM Mamba-2 layer keeps per state block, in vLLM's MambaSpec terms.

vLLM packs a MambaSpec's tensors one after another in each block's page, so the layer spec and the
model classmethods (which size the page) must list exactly the same extra tensors: both call
``replay_state_shapes`` / ``replay_state_dtypes`` on vLLM's own (conv, ssm) entries. The float32 ring
of dt comes first so every tensor's byte offset stays aligned for its dtype. Shapes follow the kernel
layout documented in ``replayssm_patch.kernels`` (ring_x [H, L, P], ring_B [G, L, N], ring_dt [H, L],
bf16 copy [H, P, N]); this module is kept free of Triton so it imports where only vLLM is installed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replayssm_patch.config import ReplaySSMConfig

# Index of each extra tensor in the layer's kv_cache list (vLLM's conv and ssm states are 0 and 1).
RING_DT, RING_X, RING_B, STATE_BF16 = 2, 3, 4, 5


@dataclass(frozen=True)
class Mamba2Dims:
    """Per-rank Mamba-2 sizes, read back from vLLM's own (conv, ssm) state shapes."""

    nheads: int
    head_dim: int
    ngroups: int
    d_state: int

    @classmethod
    def from_state_shapes(cls, conv_shape: tuple[int, ...], ssm_shape: tuple[int, ...], dim_first: bool) -> Mamba2Dims:
        nheads, head_dim, d_state = ssm_shape
        conv_dim = conv_shape[0] if dim_first else conv_shape[1]
        ngroups, rest = divmod(conv_dim - nheads * head_dim, 2 * d_state)
        if rest or ngroups < 1:
            raise ValueError(f"conv state {conv_shape} does not fit ssm state {ssm_shape}")
        return cls(nheads, head_dim, ngroups, d_state)


def replay_state_shapes(
    stock: tuple[tuple[int, ...], ...], config: ReplaySSMConfig, dim_first: bool, verify_len: int = 0
) -> tuple[tuple[int, ...], ...]:
    """vLLM's (conv, ssm) shapes followed by ring_dt, ring_x, ring_B and, with split precision, the bf16 copy.

    Under speculative decoding (``verify_len`` = 1 + k, ``config.verify_len_of``) the rings hold buffer_len + 1 + k
    entries: a full window still takes one verify before it folds. vLLM's conv shape is kept as given (widened
    by k columns for speculation)."""
    conv_shape, ssm_shape = stock
    dims = Mamba2Dims.from_state_shapes(conv_shape, ssm_shape, dim_first)
    L = config.buffer_len + verify_len
    extra: list[tuple[int, ...]] = [
        (dims.nheads, L),
        (dims.nheads, L, dims.head_dim),
        (dims.ngroups, L, dims.d_state),
    ]
    if config.split_precision:
        extra.append((dims.nheads, dims.head_dim, dims.d_state))
    return (*stock, *extra)


def replay_state_dtypes(
    stock: tuple[torch.dtype, ...], model_dtype: torch.dtype, config: ReplaySSMConfig
) -> tuple[torch.dtype, ...]:
    """dtypes matching ``replay_state_shapes``: fp32 dt, x and B in the model dtype, bf16 copy."""
    extra = [torch.float32, model_dtype, model_dtype]
    if config.split_precision:
        extra.append(torch.bfloat16)
    return (*stock, *extra)
