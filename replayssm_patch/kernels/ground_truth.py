"""fp64 ground truth: the baseline Mamba-2 recurrence, one step at a time, which ReplaySSM must reproduce.

    h_t = exp(A * dt_t) * h_{t-1} + dt_t * x_t (x) B_t ;   y_t = h_t . C_t + D * x_t

Used by the CPU tests and as the GPU benchmark's fallback when vLLM's selective_state_update is missing.
"""

from __future__ import annotations

import torch

from replayssm_patch.kernels.common import softplus_reference
from replayssm_patch.kernels.layout import group_of_head, per_head, per_head_dt


def recurrence_step_fp64(
    h: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = True,
) -> torch.Tensor:
    """Advance h [rows, nheads, head_dim, d_state] (float64, updated in place) by one step; return y in fp64.

    x [rows, nheads, head_dim]; dt [rows, nheads] raw; B, C [rows, ngroups, d_state]; A / D / dt_bias per head.
    Rows are dense here (no slots, no padding): callers pick the rows they track.
    """
    nheads = x.shape[1]
    groups = group_of_head(nheads, B.shape[1], x.device)
    step_dt = per_head_dt(dt).double()
    if dt_bias is not None:
        step_dt = step_dt + per_head(dt_bias, nheads).double()
    if dt_softplus:
        step_dt = softplus_reference(step_dt)
    A64 = per_head(A, nheads).double()
    x64 = x.double()
    B_heads, C_heads = B.double()[:, groups], C.double()[:, groups]  # [rows, nheads, d_state]
    h.mul_(torch.exp(A64 * step_dt)[:, :, None, None])
    h.add_(step_dt[:, :, None, None] * x64[:, :, :, None] * B_heads[:, :, None, :])
    y = torch.einsum("rhpn,rhn->rhp", h, C_heads)
    if D is not None:
        y = y + per_head(D, nheads).double()[None, :, None] * x64
    return y
