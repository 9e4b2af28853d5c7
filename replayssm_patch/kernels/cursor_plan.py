"""The per-step ring plan of every decode row in one launch: read each slot's cursor, write the row's write
position and flush length, advance the cursor (before: ~17 small torch ops per step, run eagerly).

A slot's cursor is its ring entry count and the position at which its current window flushes. The first
window after a prefill ends at L-1 - (hash(slot) mod L) (``cursors.first_window_end``), later ones at L-1, so requests
admitted together (consecutive slots) flush on different steps instead of all in one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_patch.kernels.common import check_launchable

PLAN_BLOCK = 256


@triton.jit(do_not_specialize=["real_rows", "rows"])  # the row counts change every step: one compiled kernel
def _cursor_plan_kernel(
    slot_ptr, slot_stride, positions_ptr, window_end_ptr, write_pos_ptr, flush_ptr,
    real_rows, rows, ring_len, null_block, BLOCK: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_batch = offs < rows
    slot = tl.load(slot_ptr + offs * slot_stride, mask=offs < real_rows, other=null_block)
    real = (offs < real_rows) & (slot != null_block)
    pos = tl.load(positions_ptr + slot, mask=real, other=0)
    end = tl.load(window_end_ptr + slot, mask=real, other=ring_len - 1)
    flush = real & (pos >= end)
    tl.store(write_pos_ptr + offs, tl.where(real, pos, 0), mask=in_batch)
    tl.store(flush_ptr + offs, tl.where(flush, pos + 1, 0), mask=in_batch)
    tl.store(positions_ptr + slot, tl.where(flush, 0, pos + 1), mask=real)
    tl.store(window_end_ptr + slot, ring_len - 1, mask=flush)


def plan_decode_rows(
    slots: torch.Tensor,
    positions: torch.Tensor,
    window_end: torch.Tensor,
    write_pos: torch.Tensor,
    flush_len: torch.Tensor,
    real_rows: int,
    ring_len: int,
    null_block: int,
) -> None:
    """Plan ``write_pos`` / ``flush_len`` (int32 [rows], persistent buffers) for rows [0, real_rows) of
    ``slots`` and advance their cursors (``positions`` / ``window_end``, int32 per block); rows past
    real_rows (CUDA-graph padding) and null-block rows get 0. A flush row gets flush_len = write_pos + 1."""
    check_launchable(slots, positions)
    rows = write_pos.shape[0]
    if rows == 0:
        return
    _cursor_plan_kernel[(triton.cdiv(rows, PLAN_BLOCK),)](
        slots, slots.stride(0), positions, window_end, write_pos, flush_len,
        real_rows, rows, ring_len, null_block, BLOCK=PLAN_BLOCK,
    )  # fmt: skip


def plan_decode_rows_reference(
    slots: torch.Tensor,
    positions: torch.Tensor,
    window_end: torch.Tensor,
    write_pos: torch.Tensor,
    flush_len: torch.Tensor,
    real_rows: int,
    ring_len: int,
    null_block: int,
) -> None:
    """Plain-PyTorch twin of ``plan_decode_rows`` (same arguments)."""
    write_pos.zero_()
    flush_len.zero_()
    slot = slots[:real_rows].long()
    real = slot != null_block
    slot = slot[real]
    pos, end = positions[slot], window_end[slot]
    flush = pos >= end
    rows = real.nonzero().squeeze(1)
    write_pos[rows] = pos
    flush_len[rows] = torch.where(flush, pos + 1, 0).to(flush_len.dtype)
    positions[slot] = torch.where(flush, 0, pos + 1).to(positions.dtype)
    window_end[slot] = torch.where(flush, ring_len - 1, end).to(window_end.dtype)
