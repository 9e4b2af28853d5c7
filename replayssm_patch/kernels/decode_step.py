"""One ReplaySSM decode step for a Mamba-2 layer: replay (append + y) and, on the rows whose ring fills, the fold.

The Triton step is three launches (``launch_replay``): the coefficients, the replay of the rows that do not
flush, and the fold of those that do (flush_len > 0: the whole ring, this step included, into the fp32 master,
over the compacted row list ``flush_rows`` / ``flush_count`` the cursor plan wrote). Its PyTorch twin is the
plain sequence, replay then flush, which is what the kernels must equal.
"""

from __future__ import annotations

import functools

import torch

from replayssm_patch.kernels.decode_fold import FoldPlan, flush_work_list
from replayssm_patch.kernels.flush import flush_ring_reference
from replayssm_patch.kernels.layout import PAD_SLOT_ID, ring_len_of
from replayssm_patch.kernels.replay_decode import launch_replay, replay_decode_reference


def replay_decode_step(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    ssm_state: torch.Tensor,
    ring_x: torch.Tensor,
    ring_B: torch.Tensor,
    ring_dt: torch.Tensor,
    state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    flush_len: torch.Tensor,
    *,
    flush_rows: torch.Tensor | None = None,
    flush_count: torch.Tensor | None = None,
    state_bf16: torch.Tensor | None = None,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = True,
    pad_slot_id: int = PAD_SLOT_ID,
    out: torch.Tensor | None = None,
    block_p: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """The whole decode step (Triton): y for every row, reading state_bf16 when given (else ssm_state); rows
    with flush_len > 0 (the builder sets L on the step that fills the ring, or write_pos + 1 for a staggered
    first window) fold entries [0, write_pos] into ssm_state (+ state_bf16) instead, and answer from it.

    Argument shapes as in ``replay_decode``; ``flush_rows`` (int32 [batch]) and ``flush_count`` (int32 [1]) list
    the flush rows first (the cursor plan writes them; when not given they are derived here with device ops).
    Three launches with fixed grids whatever the metadata says, so it can be captured in a CUDA graph.
    Returns y [batch, nheads, head_dim].
    """
    if flush_rows is None or flush_count is None:
        flush_rows, flush_count = flush_work_list(flush_len, state_indices, write_pos, ring_len_of(ring_x), pad_slot_id)
    fold = FoldPlan(ssm_state, state_bf16, flush_len, flush_rows, flush_count)
    return launch_replay(
        x, dt, A, B, C, state_bf16 if state_bf16 is not None else ssm_state, ring_x, ring_B, ring_dt,
        state_indices, write_pos, fold=fold, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus, pad_slot_id=pad_slot_id,
        out=out, block_p=block_p, block_n=block_n, num_warps=num_warps,
    )  # fmt: skip


def replay_decode_step_reference(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    ssm_state: torch.Tensor,
    ring_x: torch.Tensor,
    ring_B: torch.Tensor,
    ring_dt: torch.Tensor,
    state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    flush_len: torch.Tensor,
    *,
    flush_rows: torch.Tensor | None = None,
    flush_count: torch.Tensor | None = None,
    state_bf16: torch.Tensor | None = None,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = True,
    pad_slot_id: int = PAD_SLOT_ID,
    out: torch.Tensor | None = None,
    block_p: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Plain-PyTorch twin of ``replay_decode_step`` (same arguments): replay, then fold entries [0, write_pos]
    of the flush rows. A flush row's y is the replay's from the fp32 master, which equals h'·C_t + D·x_t up to fp32
    rounding; with ``state_bf16`` the other rows' replay reads the copy (which a flush row's may not: a native step
    leaves it stale)."""
    del flush_rows, flush_count, block_p, block_n, num_warps
    replay = functools.partial(
        replay_decode_reference, x, dt, A, B, C, ring_x=ring_x, ring_B=ring_B, ring_dt=ring_dt,
        state_indices=state_indices, write_pos=write_pos, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus,
        pad_slot_id=pad_slot_id,
    )  # fmt: skip
    out = replay(state=ssm_state if state_bf16 is None else state_bf16, out=out)
    if state_bf16 is not None:
        flushing = flush_len > 0
        out[flushing] = replay(state=ssm_state, out=torch.empty_like(out))[flushing]
    folded = torch.where(flush_len > 0, write_pos + 1, 0).to(torch.int32)
    flush_ring_reference(
        ssm_state, ring_x, ring_B, ring_dt, A, state_indices, folded, state_bf16=state_bf16, pad_slot_id=pad_slot_id
    )
    return out
