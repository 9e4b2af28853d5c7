"""The baseline Gated DeltaNet decode recurrence, one step at a time: what ReplaySSM must reproduce.

    S' = e^g S;   u = β (v − S' k̂);   S = S' + u k̂ᵀ;   o = S q̂

in the order vLLM 0.24's packed decode kernel computes it, in the dtype of the state it is given: float64 is
the ground truth of the CPU tests; float32 is the baseline the L = 1 replay step must equal.
"""

from __future__ import annotations

import torch

from replayssm_patch.kernels.gdn_common import default_scale, gdn_gates_reference, l2_normalise_reference
from replayssm_patch.kernels.layout import group_of_head


def gdn_recurrence_step(
    h: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """Advance h [rows, num_v_heads, head_v_dim, head_k_dim] in place by one step; return o in h's dtype.

    q, k [rows, num_k_heads, head_k_dim]; v [rows, num_v_heads, head_v_dim]; a, b [rows, num_v_heads];
    A_log, dt_bias [num_v_heads]. Rows are dense here (no slots, no padding): callers pick the rows they track.
    """
    dtype = h.dtype
    key_of = group_of_head(v.shape[1], q.shape[1], v.device)
    scale = default_scale(q.shape[2]) if scale is None else scale
    q_hat = (l2_normalise_reference(q.to(dtype)) * scale)[:, key_of]
    k_hat = l2_normalise_reference(k.to(dtype))[:, key_of]
    g, beta = gdn_gates_reference(a, b, A_log, dt_bias, dtype)
    h.mul_(torch.exp(g)[:, :, None, None])
    u = beta[:, :, None] * (v.to(dtype) - (h * k_hat[:, :, None, :]).sum(-1))
    h.add_(u[:, :, :, None] * k_hat[:, :, None, :])
    return (h * q_hat[:, :, None, :]).sum(-1)
