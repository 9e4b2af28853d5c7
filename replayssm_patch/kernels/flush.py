"""Flush: fold the first flush_len ring entries into the checkpoint (one small GEMM per row and head).

h' = exp(A * sum dt) * h + X^T diag(w) B, with w_s = exp(A * dt summed after s) * dt_s. Reads and writes
the master checkpoint (fp32 in split precision) and refreshes the bf16 copy in the same pass. One program
per (batch row, head, d_state block), looping over head_dim blocks; rows with flush_len == 0 or a padding slot
return at once. Given the list of folding rows, a fixed grid walks their (row, head, d_state block) items
instead. Decode steps fold in a launch of their own (``decode_fold``); this one serves the rest: materialising
the ring before a prefill reads the checkpoint, the fold before a speculative verify (``verify``), and draining
rings in tests and benches.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_patch.kernels.common import (
    block_size,
    check_launchable,
    decay_sum_after,
    decay_sum_after_reference,
    register_cap,
)
from replayssm_patch.kernels.decode_fold import fold_programs, fold_work_item
from replayssm_patch.kernels.launch_config import fold_launch_for
from replayssm_patch.kernels.layout import PAD_SLOT_ID, group_of_head, per_head, ring_entries, ring_len_of, valid_rows
from replayssm_patch.kernels.state_products import fp32_dot


# Before a prefill, the prefill rows' indices are a slice at the decode rows' offset: never specialise on its
# alignment, or a new batch composition can compile a new kernel while serving (as the decode kernels did).
@triton.jit(do_not_specialize_on_alignment=["slot_ptr", "len_ptr"])
def _flush_kernel(
    A_ptr, state_ptr, bf16_ptr, ring_x_ptr, ring_B_ptr, ring_dt_ptr, slot_ptr, len_ptr, rows_ptr, count_ptr,
    head_dim, d_state, ring_len, nheads, heads_per_group, pad_slot_id,
    ss_slot, ss_h, ss_p, ss_n, sc_slot, sc_h, sc_p, sc_n,
    srx_slot, srx_l, srx_h, srx_p, srB_slot, srB_l, srB_g, srB_n, srdt_slot, srdt_l, srdt_h,
    HAS_LIST: tl.constexpr, HAS_BF16: tl.constexpr, PREFETCH: tl.constexpr, BLOCK_L: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, P_BLOCKS: tl.constexpr, N_BLOCKS: tl.constexpr,
    B_IN_TF32: tl.constexpr,
):  # fmt: skip
    if HAS_LIST:  # a fixed grid walks the (listed row, head, d_state block) items: a row that does not fold takes none
        items = tl.load(count_ptr) * nheads * N_BLOCKS
        item = tl.program_id(0)
        while item < items:
            row, head, nblock = fold_work_item(item, rows_ptr, nheads, N_BLOCKS)
            _fold_row_head(
                A_ptr, state_ptr, bf16_ptr, ring_x_ptr, ring_B_ptr, ring_dt_ptr, slot_ptr, len_ptr, row, head, nblock,
                head_dim, d_state, ring_len, heads_per_group, pad_slot_id, ss_slot, ss_h, ss_p, ss_n, sc_slot, sc_h,
                sc_p, sc_n, srx_slot, srx_l, srx_h, srx_p, srB_slot, srB_l, srB_g, srB_n, srdt_slot, srdt_l, srdt_h,
                HAS_BF16, PREFETCH, BLOCK_L, BLOCK_P, BLOCK_N, P_BLOCKS, B_IN_TF32,
            )  # fmt: skip
            item += tl.num_programs(0)
    else:
        _fold_row_head(
            A_ptr, state_ptr, bf16_ptr, ring_x_ptr, ring_B_ptr, ring_dt_ptr, slot_ptr, len_ptr, tl.program_id(0),
            tl.program_id(1) // N_BLOCKS, tl.program_id(1) % N_BLOCKS, head_dim, d_state, ring_len, heads_per_group,
            pad_slot_id, ss_slot, ss_h, ss_p, ss_n, sc_slot, sc_h, sc_p, sc_n, srx_slot, srx_l, srx_h, srx_p,
            srB_slot, srB_l, srB_g, srB_n, srdt_slot, srdt_l, srdt_h, HAS_BF16, PREFETCH, BLOCK_L, BLOCK_P, BLOCK_N,
            P_BLOCKS, B_IN_TF32,
        )  # fmt: skip


@triton.jit(noinline=True)
def _fold_row_head(
    A_ptr, state_ptr, bf16_ptr, ring_x_ptr, ring_B_ptr, ring_dt_ptr, slot_ptr, len_ptr, row, head, nblock,
    head_dim, d_state, ring_len, heads_per_group, pad_slot_id,
    ss_slot, ss_h, ss_p, ss_n, sc_slot, sc_h, sc_p, sc_n,
    srx_slot, srx_l, srx_h, srx_p, srB_slot, srB_l, srB_g, srB_n, srdt_slot, srdt_l, srdt_h,
    HAS_BF16: tl.constexpr, PREFETCH: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr, P_BLOCKS: tl.constexpr, B_IN_TF32: tl.constexpr,
):  # fmt: skip
    """Fold d_state block ``nblock`` of one (row, head): every head_dim block of that slice of its master tile; a
    padding row or one with nothing to fold returns at once. Not inlined: in the listed kernel's loop over items the
    compiler kept the tiles' address offsets live from one item to the next (ptxas: 254 registers in order, spills
    with the prefetch); as a call, the kernel takes the registers of the one without a list (230 with the
    prefetch)."""
    slot = tl.load(slot_ptr + row).to(tl.int64)
    count = tl.minimum(tl.load(len_ptr + row), ring_len)
    if (slot == pad_slot_id) | (slot < 0) | (count <= 0):
        return
    group = head // heads_per_group
    offs_n = nblock * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_l = tl.arange(0, BLOCK_L)
    mask_n = offs_n < d_state
    live = offs_l < count

    A = tl.load(A_ptr + head).to(tl.float32)
    dt = tl.load(ring_dt_ptr + slot * srdt_slot + offs_l * srdt_l + head * srdt_h, mask=live, other=0.0)
    dt = dt.to(tl.float32)
    weight = tl.where(live, tl.exp(A * decay_sum_after(dt, offs_l)) * dt, 0.0)
    decay = tl.exp(A * tl.sum(dt, axis=0))
    ring_B = tl.load(
        ring_B_ptr + slot * srB_slot + offs_l[:, None] * srB_l + group * srB_g + offs_n[None, :] * srB_n,
        mask=live[:, None] & mask_n[None, :], other=0.0,
    ).to(tl.float32)  # fmt: skip
    # All head_dim blocks in one program (an idle row exits once). PREFETCH issues each block's loads before the
    # previous block's stores (a load after a store the compiler cannot prove apart from it waits for the store),
    # at the price of registers (ptxas, 16 x 128 on 4 warps, the two-pass dot: 196 against 156 at L = 16; 224 against
    # 159 at the verify ring's 32, where tf32x3 spilled). A form that fed the blocks through shared memory instead (a
    # tl.range loop Triton's pipeliner ran 2-3 stages deep) lost at every shape (session 24, batch 256: 170.5 / 184.6
    # µs at 3 / 2 stages against 129.9 in order) and is removed.
    state_row, x_row = state_ptr + slot * ss_slot + head * ss_h, ring_x_ptr + slot * srx_slot + head * srx_h
    for pblock in tl.static_range(P_BLOCKS):
        if pblock == 0 or not PREFETCH:  # in order: this block's loads after the previous block's stores
            block = _fold_block_loads(state_row, x_row, head_dim, live, mask_n, offs_n, ss_p, ss_n, srx_l, srx_p,
                                      pblock, BLOCK_L, BLOCK_P)  # fmt: skip
        current = block
        if PREFETCH and pblock + 1 < P_BLOCKS:  # the next block's loads before this block's stores
            block = _fold_block_loads(state_row, x_row, head_dim, live, mask_n, offs_n, ss_p, ss_n, srx_l, srx_p,
                                      pblock + 1, BLOCK_L, BLOCK_P)  # fmt: skip
        _fold_block(current, weight, ring_B, decay, bf16_ptr, slot, head, offs_n, sc_slot, sc_h, sc_p, sc_n, pblock,
                    HAS_BF16, BLOCK_P, B_IN_TF32)  # fmt: skip


@triton.jit
def _fold_block(
    block, weight, ring_B, decay, bf16_ptr, slot, head, offs_n, sc_slot, sc_h, sc_p, sc_n, pblock,
    HAS_BF16: tl.constexpr, BLOCK_P: tl.constexpr, B_IN_TF32: tl.constexpr,
):  # fmt: skip
    """Fold one [head_dim block, d_state block] tile as ``_fold_block_loads`` read it: h' = decay * h + (X ⊙ w)ᵀ B,
    stored to the master (and to the bf16 copy); the product accumulates into the decayed tile."""
    ring_x, h_old, state_at, mask_pn = block
    h = fp32_dot(tl.trans(ring_x * weight[:, None]), ring_B, decay * h_old, False, B_IN_TF32)  # [P, N]
    tl.store(state_at, h.to(state_at.dtype.element_ty), mask=mask_pn)
    if HAS_BF16:
        offs_p = pblock * BLOCK_P + tl.arange(0, BLOCK_P)
        copy_at = bf16_ptr + slot * sc_slot + head * sc_h + offs_p[:, None] * sc_p + offs_n[None, :] * sc_n
        tl.store(copy_at, h.to(bf16_ptr.dtype.element_ty), mask=mask_pn)


@triton.jit
def _fold_block_loads(
    state_row, x_row, head_dim, live, mask_n, offs_n, ss_p, ss_n, srx_l, srx_p, pblock,
    BLOCK_L: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    """One head_dim block of a folding (row, head) over the d_state columns ``offs_n``, given its master tile's and
    ring x's first elements: the ring x [L, P] and master tile [P, N] in fp32, the tile's pointers and mask."""
    offs_p = pblock * BLOCK_P + tl.arange(0, BLOCK_P)
    mask_p = offs_p < head_dim
    ring_x = tl.load(
        x_row + tl.arange(0, BLOCK_L)[:, None] * srx_l + offs_p[None, :] * srx_p,
        mask=live[:, None] & mask_p[None, :], other=0.0,
    ).to(tl.float32)  # fmt: skip
    mask_pn = mask_p[:, None] & mask_n[None, :]
    state_at = state_row + offs_p[:, None] * ss_p + offs_n[None, :] * ss_n
    return ring_x, tl.load(state_at, mask=mask_pn, other=0.0).to(tl.float32), state_at, mask_pn


def flush_ring(
    ssm_state: torch.Tensor,
    ring_x: torch.Tensor,
    ring_B: torch.Tensor,
    ring_dt: torch.Tensor,
    A: torch.Tensor,
    state_indices: torch.Tensor,
    flush_len: torch.Tensor,
    *,
    state_bf16: torch.Tensor | None = None,
    pad_slot_id: int = PAD_SLOT_ID,
    work_list: tuple[torch.Tensor, torch.Tensor] | None = None,
    block_p: int | None = None,
    num_warps: int | None = None,
    prefetch: bool | None = None,
    maxnreg: int | None = None,
    programs_per_sm: int | None = None,
    block_n: int | None = None,
) -> None:
    """Fold ring entries [0, flush_len) of each row into ssm_state in place (and into state_bf16 if given).

    ssm_state [slots, nheads, head_dim, d_state] is the master (any float dtype; fp32 for split precision);
    flush_len int [batch]: 0 = leave the row alone (values above L count as L). Padding rows are skipped.
    The ring itself is not cleared: the caller restarts the row's write_pos at 0. ``work_list`` (rows int32
    [batch], count int32 [1]: the rows with flush_len > 0 first, as the cursor plans and ``flush_work_list`` give
    them): a fixed grid (``fold_programs``: 3 programs per SM) walks only those rows' heads, where otherwise every
    (row, head) gets a program and the idle rows' returns cost the launch time (session 22, the verify's fold at
    batch 128 / 256: 68.8 / 131.6 µs walking the list, 74.8 / 145.7 with a program per row). ``block_p`` (head_dim
    rows per program, at least 16 for tl.dot), ``num_warps``, ``prefetch`` (each head_dim block's loads before the
    previous block's stores), ``maxnreg`` (registers per thread, 0: ptxas decides), ``programs_per_sm`` (the
    listed grid's, 0: ``PROGRAMS_PER_SM``) and ``block_n`` (d_state columns per work item, 0: all of them) are GPU
    tuning knobs only; unset, the launch table's ``"fold"`` entry decides.
    The dot runs on tensor cores at fp32-level error (``state_products.fp32_dot``): B from a 16-bit ring is exact in
    tf32, so two passes (x·w's tf32 head and its remainder) do what tf32x3 did in three. ptxas at the verify ring's
    32 entries, 16 x 4 warps, walking the list (session 25): in order 159 registers and 1,968 instructions against
    tf32x3's 189 and 2,496; with the prefetch 224 registers and no spills (tf32x3: 255, 64 bytes spilled); the
    split copy's prefetch form 247, no spills (255, 196 bytes spilled). The fp32 FMA dot ("ieee") took 242-255.
    """
    check_launchable(ssm_state, ring_x)
    nheads, head_dim, d_state = ssm_state.shape[1:]
    ngroups = ring_B.shape[1]
    A = per_head(A, nheads)
    batch = state_indices.shape[0]
    if batch == 0:
        return
    tuned = fold_launch_for(state_bf16 is not None, ssm_state.device)
    prefetch = tuned.prefetch if prefetch is None else prefetch
    BLOCK_P = block_size(head_dim, cap=block_p or tuned.block_p, floor=16)
    BLOCK_N = block_size(d_state, cap=(tuned.block_n if block_n is None else block_n) or d_state, floor=16)
    N_BLOCKS = triton.cdiv(d_state, BLOCK_N)
    copy = state_bf16 if state_bf16 is not None else ssm_state
    rows, count = work_list if work_list is not None else (flush_len, flush_len)
    per_sm = tuned.programs_per_sm if programs_per_sm is None else programs_per_sm
    listed = (min(batch * nheads * N_BLOCKS, fold_programs(ssm_state.device, per_sm)),)
    grid = listed if work_list is not None else (batch, nheads * N_BLOCKS)
    _flush_kernel[grid](
        A, ssm_state, copy, ring_x, ring_B, ring_dt, state_indices, flush_len, rows, count,
        head_dim, d_state, ring_len_of(ring_x), nheads, nheads // ngroups, pad_slot_id,
        *ssm_state.stride(), *copy.stride(),
        *ring_entries(ring_x).stride(), *ring_entries(ring_B).stride(), *ring_entries(ring_dt).stride(),
        HAS_LIST=work_list is not None, HAS_BF16=state_bf16 is not None,
        PREFETCH=prefetch, BLOCK_L=block_size(ring_len_of(ring_x), floor=16), BLOCK_P=BLOCK_P,
        BLOCK_N=BLOCK_N, P_BLOCKS=triton.cdiv(head_dim, BLOCK_P), N_BLOCKS=N_BLOCKS,
        B_IN_TF32=ring_B.dtype.itemsize <= 2,
        num_warps=num_warps or tuned.num_warps,
        **register_cap(tuned.maxnreg if maxnreg is None else maxnreg),
    )  # fmt: skip


def flush_ring_reference(
    ssm_state: torch.Tensor,
    ring_x: torch.Tensor,
    ring_B: torch.Tensor,
    ring_dt: torch.Tensor,
    A: torch.Tensor,
    state_indices: torch.Tensor,
    flush_len: torch.Tensor,
    *,
    state_bf16: torch.Tensor | None = None,
    pad_slot_id: int = PAD_SLOT_ID,
    work_list: tuple[torch.Tensor, torch.Tensor] | None = None,
    block_p: int | None = None,
    num_warps: int | None = None,
    prefetch: bool | None = None,
    maxnreg: int | None = None,
    programs_per_sm: int | None = None,
    block_n: int | None = None,
) -> None:
    """Plain-PyTorch twin of ``flush_ring`` (same arguments; the work list and the tuning knobs are ignored: every
    row with flush_len > 0 folds), in fp32."""
    del work_list, block_p, num_warps, prefetch, maxnreg, programs_per_sm, block_n
    nheads = ssm_state.shape[1]
    A = per_head(A, nheads).float()
    rows = (valid_rows(state_indices, pad_slot_id) & (flush_len > 0)).nonzero().squeeze(1)
    if rows.numel() == 0:
        return
    ring_len = ring_len_of(ring_x)
    ring_x, ring_B, ring_dt = ring_entries(ring_x), ring_entries(ring_B), ring_entries(ring_dt)
    slots, count = state_indices[rows].long(), flush_len[rows].long().clamp(max=ring_len)
    live = torch.arange(ring_len, device=ring_x.device)[None, :] < count[:, None]  # [R, L]
    dt = torch.where(live[:, :, None], ring_dt[slots].float(), 0.0)  # [R, L, H]
    weight = torch.where(live[:, :, None], torch.exp(A * decay_sum_after_reference(dt, 1)) * dt, 0.0)
    x = torch.where(live[:, :, None, None], ring_x[slots].float(), 0.0)  # [R, L, H, P]
    B_heads = ring_B[slots].float()[:, :, group_of_head(nheads, ring_B.shape[2], ring_x.device)]
    B_heads = torch.where(live[:, :, None, None], B_heads, 0.0)  # [R, L, H, N]
    update = torch.einsum("rlh,rlhp,rlhn->rhpn", weight, x, B_heads)
    h = torch.exp(A * dt.sum(1))[:, :, None, None] * ssm_state[slots].float() + update
    ssm_state[slots] = h.to(ssm_state.dtype)
    if state_bf16 is not None:
        state_bf16[slots] = h.to(state_bf16.dtype)
