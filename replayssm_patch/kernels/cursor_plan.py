"""The per-step ring plan of every decode row in one launch: read each slot's cursor, write the row's write
position and flush length, advance the cursor (before: ~17 small torch ops per step, run eagerly).

A slot's cursor is its ring entry count and the position at which its current window flushes. The first
window after a prefill ends at L-1 - (hash(slot) mod L) (``cursors.first_window_end``), later ones at L-1, so requests
admitted together (consecutive slots) flush on different steps instead of all in one.

Speculative decoding plans verify steps instead (``plan_verify_rows``): the cursor commits the accepted prefix of
the row's last verify first, and a row whose history would overflow the ring folds it before appending.

A prefill row (or a decode row leaving the replay regime) takes its ring's entries for the fold and restarts its
cursor (``plan_take_pending``), also in one launch: steps with prefills run eagerly, and the ~15 small torch ops it
replaces each cost host time there, once or twice per KV-cache group and step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_patch.cursors import first_window_end
from replayssm_patch.kernels.common import check_launchable

PLAN_BLOCK = 256


@triton.jit(do_not_specialize=["real_rows", "rows"])  # the row counts change every step: one compiled kernel
def _cursor_plan_kernel(
    slot_ptr, slot_stride, positions_ptr, window_end_ptr, write_pos_ptr, flush_ptr, flush_rows_ptr, flush_count_ptr,
    real_rows, rows, ring_len, null_block, HAS_LIST: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    offs = tl.arange(0, BLOCK)  # one program holds every row, so the flush list needs no atomics
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
    if HAS_LIST:
        flags = flush.to(tl.int32)
        tl.store(flush_rows_ptr + tl.cumsum(flags, axis=0) - 1, offs, mask=flush)
        tl.store(flush_count_ptr, tl.sum(flags, axis=0))


def plan_decode_rows(
    slots: torch.Tensor,
    positions: torch.Tensor,
    window_end: torch.Tensor,
    write_pos: torch.Tensor,
    flush_len: torch.Tensor,
    real_rows: int,
    ring_len: int,
    null_block: int,
    flush_rows: torch.Tensor | None = None,
    flush_count: torch.Tensor | None = None,
) -> None:
    """Plan ``write_pos`` / ``flush_len`` (int32 [rows], persistent buffers) for rows [0, real_rows) of
    ``slots`` and advance their cursors (``positions`` / ``window_end``, int32 per block); rows past
    real_rows (CUDA-graph padding) and null-block rows get 0. A flush row gets flush_len = write_pos + 1.
    With ``flush_rows`` (int32 [rows]) and ``flush_count`` (int32 [1]) it also lists the flush rows, in row
    order, for the decode step's fold (entries past the count are left as they were)."""
    check_launchable(slots, positions)
    rows = write_pos.shape[0]
    if rows == 0:
        return
    has_list = flush_rows is not None and flush_count is not None
    _cursor_plan_kernel[(1,)](
        slots, slots.stride(0), positions, window_end, write_pos, flush_len,
        flush_rows if has_list else write_pos, flush_count if has_list else write_pos,
        real_rows, rows, ring_len, null_block, HAS_LIST=has_list, BLOCK=max(PLAN_BLOCK, triton.next_power_of_2(rows)),
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
    flush_rows: torch.Tensor | None = None,
    flush_count: torch.Tensor | None = None,
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
    if flush_rows is not None and flush_count is not None:
        listed = rows[flush]
        flush_rows[: listed.numel()] = listed.to(flush_rows.dtype)
        flush_count.fill_(listed.numel())


@triton.jit(do_not_specialize=["real_rows", "rows"])
def _verify_plan_kernel(
    slot_ptr, slot_stride, qsl_ptr, accepted_ptr, positions_ptr, pending_ptr, window_end_ptr, write_pos_ptr, fold_ptr,
    fold_rows_ptr, fold_count_ptr, real_rows, rows, buffer_len, verify_len, null_block, HAS_LIST: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # with the list, one program holds every row
    in_batch = offs < rows
    slot = tl.load(slot_ptr + offs * slot_stride, mask=offs < real_rows, other=null_block)
    real = (offs < real_rows) & (slot != null_block)
    count = tl.load(qsl_ptr + offs + 1, mask=real, other=0) - tl.load(qsl_ptr + offs, mask=real, other=0)
    pending = tl.load(pending_ptr + slot, mask=real, other=0)
    accepted = tl.minimum(tl.maximum(tl.load(accepted_ptr + offs, mask=real, other=0), 0), pending)
    committed = tl.load(positions_ptr + slot, mask=real, other=0) + accepted
    end = tl.load(window_end_ptr + slot, mask=real, other=buffer_len - 1)
    fold = real & (committed + count > end + 1 + verify_len)
    write = tl.where(fold, 0, committed)
    tl.store(write_pos_ptr + offs, tl.where(real, write, 0), mask=in_batch)
    tl.store(fold_ptr + offs, tl.where(fold, committed, 0), mask=in_batch)
    tl.store(positions_ptr + slot, write, mask=real)
    tl.store(pending_ptr + slot, count, mask=real)
    tl.store(window_end_ptr + slot, buffer_len - 1, mask=fold)
    if HAS_LIST:
        flags = fold.to(tl.int32)
        tl.store(fold_rows_ptr + tl.cumsum(flags, axis=0) - 1, offs, mask=fold)
        tl.store(fold_count_ptr, tl.sum(flags, axis=0))


def plan_verify_rows(
    slots: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_accepted: torch.Tensor,
    positions: torch.Tensor,
    pending: torch.Tensor,
    window_end: torch.Tensor,
    write_pos: torch.Tensor,
    fold_len: torch.Tensor,
    real_rows: int,
    buffer_len: int,
    verify_len: int,
    null_block: int,
    fold_rows: torch.Tensor | None = None,
    fold_count: torch.Tensor | None = None,
) -> None:
    """Plan a verify step in one launch: commit, fold decision and write position of rows [0, real_rows).

    Per row: committed = positions + min(num_accepted, pending), the accepted prefix of the row's last verify
    (nothing after a prefill, whose pending is 0). If committed + T_r would pass the window's end plus
    ``verify_len`` (T_max; the ring holds buffer_len + T_max entries): fold_len = committed, write_pos = 0;
    else fold_len = 0, write_pos = committed. positions becomes write_pos and pending T_r; rejected entries
    are simply overwritten later. Rows past real_rows (graph padding) and null-block rows get 0 and move
    nothing. Device work only, no ``.item()``: vLLM's async scheduler may still be correcting num_accepted.
    ``fold_rows`` (int32 [rows]) / ``fold_count`` (int32 [1]), when given, receive the list of folding rows, in row
    order, for the fold's work list (entries past the count are left as they were).
    """
    check_launchable(slots, positions)
    rows = write_pos.shape[0]
    if rows == 0:
        return
    has_list = fold_rows is not None and fold_count is not None
    block = max(PLAN_BLOCK, triton.next_power_of_2(rows)) if has_list else PLAN_BLOCK
    _verify_plan_kernel[(triton.cdiv(rows, block),)](
        slots, slots.stride(0), query_start_loc, num_accepted, positions, pending, window_end, write_pos, fold_len,
        fold_rows if has_list else write_pos, fold_count if has_list else write_pos, real_rows, rows, buffer_len,
        verify_len, null_block, HAS_LIST=has_list, BLOCK=block,
    )  # fmt: skip


def plan_verify_rows_reference(
    slots: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_accepted: torch.Tensor,
    positions: torch.Tensor,
    pending: torch.Tensor,
    window_end: torch.Tensor,
    write_pos: torch.Tensor,
    fold_len: torch.Tensor,
    real_rows: int,
    buffer_len: int,
    verify_len: int,
    null_block: int,
    fold_rows: torch.Tensor | None = None,
    fold_count: torch.Tensor | None = None,
) -> None:
    """Plain-PyTorch twin of ``plan_verify_rows`` (same arguments)."""
    write_pos.zero_()
    fold_len.zero_()
    slot = slots[:real_rows].long()
    rows = (slot != null_block).nonzero().squeeze(1)
    slot = slot[rows]
    count = (query_start_loc[rows + 1] - query_start_loc[rows]).to(pending.dtype)
    committed = positions[slot] + torch.minimum(num_accepted[rows].to(pending.dtype).clamp(min=0), pending[slot])
    fold = committed + count > window_end[slot] + 1 + verify_len
    write = torch.where(fold, 0, committed)
    write_pos[rows] = write.to(write_pos.dtype)
    fold_len[rows] = torch.where(fold, committed, 0).to(fold_len.dtype)
    positions[slot] = write.to(positions.dtype)
    pending[slot] = count
    window_end[slot] = torch.where(fold, buffer_len - 1, window_end[slot]).to(window_end.dtype)
    if fold_rows is not None and fold_count is not None:
        listed = rows[fold]
        fold_rows[: listed.numel()] = listed.to(fold_rows.dtype)
        fold_count.fill_(listed.numel())


# The prefill rows' indices are a slice at the decode rows' offset, whose alignment changes with the batch: never
# specialise on it, or a new batch composition compiles a new kernel while serving (as gdn_flush's comment says).
@triton.jit(do_not_specialize=["rows"], do_not_specialize_on_alignment=["slot_ptr", "has_state_ptr", "accepted_ptr"])
def _take_pending_kernel(
    slot_ptr, slot_stride, has_state_ptr, has_state_stride, accepted_ptr, accepted_stride, positions_ptr, pending_ptr,
    window_end_ptr, out_ptr, rows, buffer_len, null_block,
    HAS_STATE: tl.constexpr, SPECULATIVE: tl.constexpr, HAS_ACCEPTED: tl.constexpr, STAGGER: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_batch = offs < rows
    slot = tl.load(slot_ptr + offs * slot_stride, mask=in_batch, other=null_block)
    real = in_batch & (slot != null_block)
    continuing = real
    if HAS_STATE:
        continuing = real & (tl.load(has_state_ptr + offs * has_state_stride, mask=real, other=0) != 0)
    committed = tl.load(positions_ptr + slot, mask=real, other=0)
    if SPECULATIVE:
        accepted = tl.zeros_like(committed)
        if HAS_ACCEPTED:
            accepted = tl.load(accepted_ptr + offs * accepted_stride, mask=real, other=0).to(tl.int32)
        committed += tl.minimum(tl.maximum(accepted, 0), tl.load(pending_ptr + slot, mask=real, other=0))
        tl.store(pending_ptr + slot, 0, mask=real)
    tl.store(out_ptr + offs, tl.where(continuing, committed, 0), mask=in_batch)
    tl.store(positions_ptr + slot, 0, mask=real)
    offset = tl.zeros_like(slot).to(tl.int64)
    if STAGGER:  # cursors.first_window_end's hash, in int64 as there: (slot * 2654435761 mod 2**32) >> 16
        offset = (slot.to(tl.int64) * 2654435761 % 4294967296) >> 16
    tl.store(window_end_ptr + slot, (buffer_len - 1 - offset % buffer_len).to(tl.int32), mask=real)


def plan_take_pending(
    slots: torch.Tensor,
    has_state: torch.Tensor | None,
    num_accepted: torch.Tensor | None,
    positions: torch.Tensor,
    pending: torch.Tensor | None,
    window_end: torch.Tensor,
    buffer_len: int,
    stagger: bool,
    null_block: int,
) -> torch.Tensor:
    """``CursorTable.take_pending`` in one launch: return each row's ring entries to fold (int32 [rows]) and restart
    the rows' cursors.

    A row continuing its sequence (``has_state``, bool [rows]; default every row) gets its committed count: the
    cursor ``positions``, plus under speculation (``pending`` given) min(max(num_accepted, 0), pending) of its last
    verify (num_accepted absent: 0); any other row gets 0. Every non-null-block row then restarts: positions (and
    pending) 0, window_end its first window's end (``cursors.first_window_end``); null-block rows move nothing."""
    check_launchable(slots, positions)
    rows = slots.shape[0]
    taken = torch.empty(rows, dtype=torch.int32, device=slots.device)
    if rows == 0:
        return taken
    # an absent tensor's flag compiles its loads out: any pointer stands in for it
    _take_pending_kernel[(triton.cdiv(rows, PLAN_BLOCK),)](
        slots, slots.stride(0),
        slots if has_state is None else has_state, 0 if has_state is None else has_state.stride(0),
        slots if num_accepted is None else num_accepted, 0 if num_accepted is None else num_accepted.stride(0),
        positions, positions if pending is None else pending, window_end, taken, rows, buffer_len, null_block,
        HAS_STATE=has_state is not None, SPECULATIVE=pending is not None, HAS_ACCEPTED=num_accepted is not None,
        STAGGER=stagger, BLOCK=PLAN_BLOCK,
    )  # fmt: skip
    return taken


def plan_take_pending_reference(
    slots: torch.Tensor,
    has_state: torch.Tensor | None,
    num_accepted: torch.Tensor | None,
    positions: torch.Tensor,
    pending: torch.Tensor | None,
    window_end: torch.Tensor,
    buffer_len: int,
    stagger: bool,
    null_block: int,
) -> torch.Tensor:
    """Plain-PyTorch twin of ``plan_take_pending`` (same arguments)."""
    slots = slots.long()
    real = slots != null_block
    continuing = real if has_state is None else real & has_state
    committed = positions[slots]
    if pending is not None:
        accepted = torch.zeros_like(committed) if num_accepted is None else num_accepted.to(committed.dtype)
        committed = committed + torch.minimum(accepted.clamp(min=0), pending[slots])
        pending[slots] = torch.where(real, 0, pending[slots])
    taken = torch.where(continuing, committed, 0).to(torch.int32)
    positions[slots] = torch.where(real, 0, positions[slots])
    window_end[slots] = torch.where(real, first_window_end(slots, buffer_len, stagger), window_end[slots])
    return taken
