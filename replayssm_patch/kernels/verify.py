"""Speculative verify of a Mamba-2 layer through the ring: all T = 1+k query tokens of a row from ONE checkpoint read.

Row r holds m = write_pos[r] committed entries (ring positions 0..m-1) and T_r = qsl[r+1] - qsl[r] query tokens,
appended at m..m+T_r-1. Token j answers with the baseline recurrence's output after entries 0..m+j:
    y_j = exp(A*S_{m+j}) (h_c·C_j) + sum_{s <= m+j} exp(A*(S_{m+j} - S_s)) dt_s (B_s·C_j) x_s + D x_j
a masked T x (m+T) coefficient matrix times the entries' x, plus the checkpoint read once against all T C vectors.
The checkpoint is never written here: the builder commits the accepted prefix at the next step (cursor + accepted)
and rejected entries are overwritten then, so a rollback is a cursor move. A row whose history would overflow the
ring folds it first (``replay_verify_step``: ``flush_ring`` of fold_len = m entries over the verify plan's list of
folding rows, then the verify at write_pos 0).

Two launches, as the decode step: ``_verify_coefficients_kernel`` per (row, B/C group, tile of VERIFY_HEAD_CHUNK
heads) computes the tile's weights w[j, s] = exp(A·(dt summed over (s, m+j]))·dt_s and checkpoint decays as
[VERIFY_HEAD_CHUNK, L] tiles, and appends their dt; the group's first tile also computes bc[j, s] = B_s·C_j, appends
B, and writes the tokens' C in fp32 for the output launch. (Session 19 timed the launch at 127 µs at batch 256 with
the tiles as a serial loop in each program: latency, at 5 % of HBM; session 20, one program per tile, the scan and
every load before the ring stores: 27 µs.) ``_verify_step_kernel`` per (head_dim block, row, head) appends x and
forms every y_j. Both launches issue all their loads before their ring stores (session 20, at batch 256: the verify
without folds 590 -> 446 µs, of which the coefficient launch 127 -> 27); the output launch reads C in fp32 and the
checkpoint unmasked where the blocks divide it (session 21: 446 -> 413 µs). The output launch appends the tokens'
rows to the ring after its last load (its coefficient loads waited for that store's data; session 22, another host:
415 µs). The ring must hold m + T_r entries (the layout gives verify rows L + T); a row that does not fit is skipped,
like padding. The output launch's checkpoint reads run on the CUDA cores, or (``mma_stages``, a launch knob the
kernel bench sweeps) as tensor-core products over d_state tiles pipelined through shared memory, and (``mma_ring``)
the ring's T x (m+T) product as one more into the same accumulator. With ``pdl`` (a launch knob, not yet timed) the
output launch is a programmatic dependent launch of the coefficient launch: it starts while that launch's last
programs run, reads the checkpoint against the model's C, and waits for the coefficient launch only before it reads
the coefficients (the interpreter runs launches in order, so there only the form is tested). With ``heads_per_program``
(a launch knob, not yet timed; tensor-core reads only) each output program walks several heads of one group in one
pipelined loop over their d_state tiles, each head's outputs formed at its last tile, so the next head's tiles are
already loading (the split copy's verify, a program per head, ran at ~55 % of HBM); with ``tma`` (not yet timed)
the checkpoint's tiles are copied by Hopper's tensor memory accelerator through a descriptor
(``checkpoint_descriptor``), with no address arithmetic per element in registers. A fold that also
wrote its rows' h'·C_j from the tile in registers, so that the verify skips those checkpoints (~1 row in ceil(L /
AL)), lost (session 22, batch 128): the fold took 255 registers and 147.6 against 68.8 µs, the step 361.5 against
343.2.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.tools.tensor_descriptor import TensorDescriptor

from replayssm_patch.kernels.common import (
    block_size,
    check_launchable,
    decay_sum_after_reference,
    head_chunk,
    register_cap,
    softplus_f32,
    softplus_reference,
)
from replayssm_patch.kernels.flush import flush_ring, flush_ring_reference
from replayssm_patch.kernels.launch_config import verify_launch_for
from replayssm_patch.kernels.layout import PAD_SLOT_ID, group_of_head, ring_entries, ring_len_of
from replayssm_patch.kernels.replay_decode import _step_inputs
from replayssm_patch.kernels.state_products import (
    DOT_EXTENT,
    checkpoint_reads_mma,
    checkpoint_tile,
    checkpoint_tile_product,
    fp32_dot,
)

# The coefficient launch's default shape (a launch table's ``coef_head_chunk`` / ``coef_num_warps`` override it).
# T coefficient rows per (row, group) hold ~T times the decode step's registers: 4 warps keep them from spilling
# (ptxas at T = 4, L + T = 32, d_state 128: 168 registers per thread at 4 warps, 255 and spills at 2, 111-114 at 8).
VERIFY_COEF_NUM_WARPS = 4
# Heads per [heads, L] tile of the coefficient launch: the group's B tile, not the heads, sets its registers.
VERIFY_HEAD_CHUNK = 4


@triton.jit
def _ring_positions(offs_l, pos, start, count):
    """Of a verify row's ring positions: the committed history (< pos), the appended query tokens
    ([pos, pos + count)), and the query token each position holds (meaningful where appended)."""
    return offs_l < pos, (offs_l >= pos) & (offs_l < pos + count), start + offs_l - pos


@triton.jit
def _ring_rows(ring_at, new_at, new, history):
    """The ring tile with the query tokens' rows (read at ``new_at`` where ``new``) in place, in fp32: history rows
    from the ring (``ring_at``), new rows as read, 0 elsewhere; and the new rows as read, for the caller to store.
    Loads only: a load issued after a store waits for the store's data (the warp issues in order), one more memory
    latency in the program's chain, so callers store after their last load."""
    raw = tl.load(new_at, mask=new, other=0.0)
    ring = tl.load(ring_at, mask=history, other=0.0)
    return tl.where(new, raw.to(tl.float32), ring.to(tl.float32)), raw


@triton.jit
def _append_rows(ring_at, new_at, new, history):
    """``_ring_rows``, the new rows stored to their ring positions at once (the masks are disjoint)."""
    rows, raw = _ring_rows(ring_at, new_at, new, history)
    tl.store(ring_at, raw.to(ring_at.dtype.element_ty), mask=new)
    return rows


@triton.jit(do_not_specialize_on_alignment=["dt_ptr", "B_ptr", "C_ptr"])
def _verify_coefficients_kernel(
    dt_ptr, A_ptr, B_ptr, C_ptr, dt_bias_ptr, ring_B_ptr, ring_dt_ptr, slot_ptr, pos_ptr, qsl_ptr,
    bc_ptr, w_ptr, decay_ptr, c32_ptr,
    d_state, ring_len, max_tokens, pad_slot_id,
    sdt_t, sdt_h, sB_t, sB_g, sB_n, sC_t, sC_g, sC_n,
    srB_slot, srB_g, srB_l, srB_n, srdt_slot, srdt_h, srdt_l,
    HEADS_PER_GROUP: tl.constexpr, HEAD_CHUNK: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr, GDC: tl.constexpr,
):  # fmt: skip
    if GDC:  # the output launch (PDL) may start once every program here has: it waits before reading our results
        gdc_launch_dependents()
    row = tl.program_id(0)
    group = tl.program_id(1)
    chunk = tl.program_id(2)  # the group's heads in [HEAD_CHUNK, L] tiles, one per program (not a serial loop)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    start = tl.load(qsl_ptr + row).to(tl.int64)
    count = tl.load(qsl_ptr + row + 1).to(tl.int64) - start
    if (slot == pad_slot_id) | (slot < 0) | (pos < 0) | (count <= 0) | (count > max_tokens) | (pos + count > ring_len):
        return
    offs_l = tl.arange(0, BLOCK_L)
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = offs_n < d_state
    history, new, token = _ring_positions(offs_l, pos, start, count)

    groups = tl.num_programs(1)
    if chunk == 0:  # one program per (row, group) owns the group's B: its ring entries and bc
        all_B = _append_rows(  # [L, N]: the ring, T appended
            ring_B_ptr + slot * srB_slot + group * srB_g + offs_l[:, None] * srB_l + offs_n[None, :] * srB_n,
            B_ptr + token[:, None] * sB_t + group * sB_g + offs_n[None, :] * sB_n,
            new[:, None] & mask_n[None, :], history[:, None] & mask_n[None, :],
        )  # fmt: skip
        for j in tl.static_range(BLOCK_T):
            C_at = C_ptr + (start + j) * sC_t + group * sC_g + offs_n * sC_n
            C_j = tl.load(C_at, mask=mask_n & (j < count), other=0.0)
            bc_j = tl.sum(all_B * C_j.to(tl.float32)[None, :], axis=1)
            tl.store(bc_ptr + ((row * groups + group) * BLOCK_T + j) * BLOCK_L + offs_l, bc_j)
            if not PDL:  # with PDL the output launch reads the model's C itself, before it waits for this launch
                tl.store(c32_ptr + ((row * groups + group) * BLOCK_T + j) * BLOCK_N + offs_n, C_j.to(tl.float32))

    heads = HEADS_PER_GROUP * groups
    head = group * HEADS_PER_GROUP + chunk * HEAD_CHUNK + tl.arange(0, HEAD_CHUNK)
    new_h = new[None, :]  # masks broadcast over the tile [HEAD_CHUNK, L]
    dt = tl.load(dt_ptr + token[None, :] * sdt_t + head[:, None] * sdt_h, mask=new_h, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        dt += tl.load(dt_bias_ptr + head).to(tl.float32)[:, None]
    if DT_SOFTPLUS:
        dt = softplus_f32(dt)
    rdt = ring_dt_ptr + slot * srdt_slot + head[:, None] * srdt_h + offs_l[None, :] * srdt_l
    ring_dt = tl.load(rdt, mask=history[None, :], other=0.0).to(tl.float32)  # before the store, as _append_rows
    A = tl.load(A_ptr + head).to(tl.float32)  # before the store too: a load issued after a store waits for its data
    tl.store(rdt, dt.to(ring_dt_ptr.dtype.element_ty), mask=new_h)
    all_dt = tl.where(new_h, dt, ring_dt)  # 0 past the appended entries
    at = (row * heads + head) * BLOCK_T
    for j in tl.static_range(BLOCK_T):
        upto = ((offs_l <= pos + j) & (j < count))[None, :]
        dt_j = tl.where(upto, all_dt, 0.0)
        # dt summed over (s, m+j]: a reverse scan less the entry itself, not decay_sums_after's masked L x L sum (2x
        # the instructions). The subtraction costs |A|·dt_s·eps in the exponent: one entry's, not a total's.
        later = tl.cumsum(dt_j, axis=1, reverse=True) - dt_j
        weight = tl.where(upto, tl.exp(A[:, None] * later) * dt_j, 0.0)
        tl.store(w_ptr + (at + j)[:, None] * BLOCK_L + offs_l[None, :], weight)
        tl.store(decay_ptr + at + j, tl.exp(A * tl.sum(dt_j, axis=1)))


@triton.jit
def _checkpoint_reads(
    state_at, C_at, sr_p, sr_n, mask_p, d_state,
    BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, N_TILES: tl.constexpr,
    C_STRIDE: tl.constexpr, EVEN: tl.constexpr,
):  # fmt: skip
    """h_c·C_j [BLOCK_T, BLOCK_P] of every query token from one read of the checkpoint tile (C_at: the row's C in
    fp32, [BLOCK_T, C_STRIDE], 0 past its tokens): per tile and token a product summed over d_state.

    Forms that lost on the H200 (verify step fp32, batch 256): a tensor-core one, checkpoint x C^T as a tf32x3 tl.dot
    with the tokens padded to 16 (session 20: 692 µs at best, against 588); and a [T, P, N] accumulator summed over
    d_state once after the last tile (sessions 19 and 21). At 64 x 8 x 1 warp it halves the instructions per KB of
    checkpoint (ptxas and cuobjdump: 83 against 132) and ran 762 µs against 554; its best shape, 16 x 32, 624. And
    (session 22) every sum kept in the tile's register layout, C_j loaded as a [BLOCK_P, BLOCK_N] broadcast tile and
    a [BLOCK_P, BLOCK_T] accumulator: 7 layout conversions through shared memory per program instead of 38, 1,864
    instructions instead of 2,112, but 111 registers instead of 93 (and 16 more loads from L1): the verify without
    folds 245.8 against 208.0 µs at batch 128 (its split read gained, 165.8 against 179.9)."""
    offs_t = tl.arange(0, BLOCK_T)
    read = tl.zeros((BLOCK_T, BLOCK_P), dtype=tl.float32)
    for t in tl.static_range(N_TILES):
        offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
        h = checkpoint_tile(
            state_at, tl.arange(0, BLOCK_P)[:, None], offs_n[None, :], sr_p, sr_n, mask_p[:, None], d_state, EVEN
        ).to(tl.float32)
        for j in tl.static_range(BLOCK_T):
            part = tl.sum(h * tl.load(C_at + j * C_STRIDE + offs_n)[None, :], axis=1)
            read = tl.where(offs_t[:, None] == j, read + part[None, :], read)
    return read


@triton.jit(do_not_specialize_on_alignment=["x_ptr", "C_ptr", "out_ptr"])
def _verify_step_kernel(
    x_ptr, C_ptr, c32_ptr, D_ptr, read_ptr, read_desc, ring_x_ptr, slot_ptr, pos_ptr, qsl_ptr, bc_ptr, w_ptr,
    decay_ptr, out_ptr, head_dim, d_state, ring_len, max_tokens, nheads, heads_per_group, pad_slot_id,
    sx_t, sx_h, sx_p, sC_t, sC_g, sC_n, sr_slot, sr_h, sr_p, sr_n, srx_slot, srx_h, srx_l, srx_p,
    so_t, so_h, so_p,
    HAS_D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    N_TILES: tl.constexpr, C_STRIDE: tl.constexpr, EVEN: tl.constexpr, TILE_T: tl.constexpr, MMA_STAGES: tl.constexpr,
    C_IN_TF32: tl.constexpr, C_IN_BF16: tl.constexpr, RING_MMA: tl.constexpr, RING_IN_TF32: tl.constexpr,
    PDL: tl.constexpr, GDC: tl.constexpr, HEADS: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    pblock = tl.program_id(0)
    row = tl.program_id(1)
    first_head = tl.program_id(2) * HEADS  # HEADS heads of one B/C group (the launcher checks they divide it)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    start = tl.load(qsl_ptr + row).to(tl.int64)
    count = tl.load(qsl_ptr + row + 1).to(tl.int64) - start
    if (slot == pad_slot_id) | (slot < 0) | (pos < 0) | (count <= 0) | (count > max_tokens) | (pos + count > ring_len):
        return
    group = first_head // heads_per_group
    offs_p = pblock * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_l = tl.arange(0, BLOCK_L)
    mask_p = offs_p < head_dim
    ring_at = _ring_positions(offs_l, pos, start, count)  # (history, new, token): the row's, shared by its heads

    # Every load first, the ring's append last: a load after a store waits for the store's data.
    bc_row = (row * (nheads // heads_per_group) + group) * BLOCK_T
    rows_at = read_ptr + slot * sr_slot + pblock * BLOCK_P * sr_p  # the row's checkpoint, at this head_dim block
    tile_slot, first_row = slot.to(tl.int32), pblock * BLOCK_P  # where the TMA form's copies start (TMA)
    if PDL:  # the model's C: nothing before the wait in _head_outputs reads what the coefficient launch writes
        C_at, C_t, C_n, c_count = C_ptr + start * sC_t + group * sC_g, sC_t, sC_n, count
    else:
        C_at, C_t, C_n, c_count = c32_ptr + bc_row * C_STRIDE, C_STRIDE, 1, BLOCK_T
    if HEADS == 1:
        if MMA_STAGES > 0:
            read_T = checkpoint_reads_mma(rows_at + first_head * sr_h, C_at, C_t, C_n, c_count, sr_p, sr_n, mask_p,
                                          d_state, TILE_T, BLOCK_P, BLOCK_N, N_TILES, EVEN, MMA_STAGES, C_IN_TF32,
                                          C_IN_BF16, read_desc, (tile_slot, first_head, first_row), TMA)  # fmt: skip
            reads = read_T if RING_MMA else tl.trans(read_T)
        else:
            reads = _checkpoint_reads(rows_at + first_head * sr_h, C_at, sr_p, sr_n, mask_p, d_state, BLOCK_T,
                                      BLOCK_P, BLOCK_N, N_TILES, C_STRIDE, EVEN)  # fmt: skip
        _head_outputs(
            reads, first_head, row, slot, pos, start, count, ring_at, offs_l, offs_p, mask_p, bc_row, x_ptr, D_ptr,
            ring_x_ptr, bc_ptr, w_ptr, decay_ptr, out_ptr, nheads, sx_t, sx_h, sx_p, srx_slot, srx_h, srx_l, srx_p,
            so_t, so_h, so_p, HAS_D, BLOCK_T, BLOCK_L, TILE_T, RING_MMA, RING_IN_TF32, GDC,
        )  # fmt: skip
    else:  # one pipelined loop over the heads' d_state tiles: the next head's tiles load while this head's outputs form
        read_T = tl.zeros((BLOCK_P, TILE_T), dtype=tl.float32)
        for step in tl.range(0, HEADS * N_TILES, num_stages=MMA_STAGES):
            head, tile = first_head + step // N_TILES, step % N_TILES
            read_T = checkpoint_tile_product(rows_at + head * sr_h, C_at, C_t, C_n, c_count, sr_p, sr_n, mask_p,
                                             d_state, tile, read_T, TILE_T, BLOCK_P, BLOCK_N, EVEN, C_IN_TF32,
                                             C_IN_BF16, read_desc, (tile_slot, head, first_row), TMA)  # fmt: skip
            if tile == N_TILES - 1:  # the head's last tile: its outputs, then the next head's sums from 0
                _head_outputs(
                    read_T if RING_MMA else tl.trans(read_T), head, row, slot, pos, start, count, ring_at, offs_l,
                    offs_p, mask_p, bc_row, x_ptr, D_ptr, ring_x_ptr, bc_ptr, w_ptr, decay_ptr, out_ptr, nheads, sx_t,
                    sx_h, sx_p, srx_slot, srx_h, srx_l, srx_p, so_t, so_h, so_p, HAS_D, BLOCK_T, BLOCK_L, TILE_T,
                    RING_MMA, RING_IN_TF32, GDC,
                )  # fmt: skip
                read_T = tl.zeros((BLOCK_P, TILE_T), dtype=tl.float32)


@triton.jit
def _head_outputs(
    reads, head, row, slot, pos, start, count, ring_at, offs_l, offs_p, mask_p, bc_row, x_ptr, D_ptr, ring_x_ptr,
    bc_ptr, w_ptr, decay_ptr, out_ptr, nheads, sx_t, sx_h, sx_p, srx_slot, srx_h, srx_l, srx_p, so_t, so_h, so_p,
    HAS_D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_L: tl.constexpr, TILE_T: tl.constexpr, RING_MMA: tl.constexpr,
    RING_IN_TF32: tl.constexpr, GDC: tl.constexpr,
):  # fmt: skip
    """One head's outputs from its checkpoint reads (``reads``: [BLOCK_P, TILE_T] where the ring's product joins them
    on the tensor cores, else [TILE_T, BLOCK_P]; ``ring_at``: the row's ``_ring_positions``): the ring's T x (m+T)
    product, D·x, the outputs stored and the query tokens' x appended to the ring, after the last load."""
    offs_t = tl.arange(0, TILE_T)  # BLOCK_T, or tl.dot's 16 on the tensor cores
    history, new, token = ring_at
    xs, _ = _ring_rows(  # [L, P]: the ring, T appended
        ring_x_ptr + slot * srx_slot + head * srx_h + offs_l[:, None] * srx_l + offs_p[None, :] * srx_p,
        x_ptr + token[:, None] * sx_t + head * sx_h + offs_p[None, :] * sx_p, new[:, None] & mask_p[None, :],
        history[:, None] & mask_p[None, :],
    )  # fmt: skip
    mask_tp = (offs_t < count)[:, None] & mask_p[None, :]
    x_tok = tl.load(x_ptr + (start + offs_t)[:, None] * sx_t + head * sx_h + offs_p[None, :] * sx_p, mask=mask_tp)
    if GDC:  # launched before the coefficient launch ended (PDL): its results from here on
        gdc_wait()
    coef_row = (row * nheads + head) * BLOCK_T
    decay = tl.load(decay_ptr + coef_row + offs_t, mask=offs_t < BLOCK_T, other=0.0)
    if RING_MMA:  # the masked T x (m+T) product on the tensor cores too, into the checkpoint reads' accumulator
        at_T, real_T = offs_l[:, None] + offs_t[None, :] * BLOCK_L, (offs_t < BLOCK_T)[None, :]
        coef_T = tl.load(w_ptr + coef_row * BLOCK_L + at_T, mask=real_T, other=0.0)  # [L, TILE_T]
        coef_T *= tl.load(bc_ptr + bc_row * BLOCK_L + at_T, mask=real_T, other=0.0)
        y = tl.trans(fp32_dot(tl.trans(xs), coef_T, decay[None, :] * reads, RING_IN_TF32, False))
    else:
        y = decay[:, None] * reads
        for j in tl.static_range(BLOCK_T):  # the masked T x (m+T) product, one query token per pass
            coef = tl.load(w_ptr + (coef_row + j) * BLOCK_L + offs_l)
            coef *= tl.load(bc_ptr + (bc_row + j) * BLOCK_L + offs_l)
            part = tl.sum(coef[:, None] * xs, axis=0)
            y = tl.where(offs_t[:, None] == j, y + part[None, :], y)
    if HAS_D:
        y += tl.load(D_ptr + head).to(tl.float32) * x_tok.to(tl.float32)
    out_at = out_ptr + (start + offs_t)[:, None] * so_t + head * so_h + offs_p[None, :] * so_p
    tl.store(out_at, y.to(out_ptr.dtype.element_ty), mask=mask_tp)
    ring_at = ring_x_ptr + slot * srx_slot + head * srx_h + (pos + offs_t)[:, None] * srx_l + offs_p[None, :] * srx_p
    tl.store(ring_at, x_tok.to(ring_x_ptr.dtype.element_ty), mask=mask_tp)  # the query tokens' rows, appended


def checkpoint_descriptor(state: torch.Tensor, block_p: int, block_n: int) -> TensorDescriptor:
    """A tensor descriptor of the checkpoint [slots, heads, head_dim, d_state] whose copies are one [block_p, block_n]
    tile; the tensor memory accelerator needs a 16-byte-aligned base and strides and contiguous columns, which vLLM's
    paged caches have (a page is a multiple of 16 bytes): anything else is refused in one line naming the fix."""
    byte_strides = [stride * state.element_size() for stride in state.stride()[:-1]]
    aligned = state.data_ptr() % 16 == 0 and all(stride % 16 == 0 for stride in byte_strides)
    if state.dim() != 4 or state.stride(-1) != 1 or not aligned:
        raise ValueError(
            f"tma: the checkpoint (shape {tuple(state.shape)}, strides {state.stride()}) is not 16-byte aligned with "
            "contiguous columns; run this cache without the knob (tma 0 in the launch table)"
        )
    return TensorDescriptor(state, list(state.shape), list(state.stride()), [1, 1, block_p, block_n])


def verify_coefficients(
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    ring_B: torch.Tensor,
    ring_dt: torch.Tensor,
    state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    *,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    pad_slot_id: int,
    pdl: bool = False,
    heads_per_program: int = 0,
    num_warps: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The verify's first launch (dt, A, dt_bias per head, as ``replay_verify`` has them): appends B and dt to the
    rings and returns bc [batch, groups, T, L], the weights [batch, heads, T, L], the checkpoint decays
    [batch, heads, T] (blocks of powers of two, flat), and C in fp32 [batch, groups, T, N] (0 past each row's
    tokens and past d_state): the output launch reads C in every program, so it is converted once here. ``pdl``:
    the output launch follows as a programmatic dependent launch, which reads the model's C itself (no fp32 copy
    is written), and this launch lets it start early (on a GPU). ``heads_per_program`` and ``num_warps``: its launch
    shape (0: ``VERIFY_HEAD_CHUNK`` and ``VERIFY_COEF_NUM_WARPS``; the heads are capped at the group's largest power
    of two). Its own function so the kernel bench can time it alone."""
    batch, nheads = state_indices.shape[0], dt.shape[1]
    ngroups, d_state = B.shape[1], B.shape[2]
    ring_len = ring_len_of(ring_B)
    BLOCK_T, BLOCK_L = block_size(max_query_len), block_size(ring_len, floor=16)
    BLOCK_N = block_size(d_state, floor=16)
    sizes = (ngroups * BLOCK_T * BLOCK_L, nheads * BLOCK_T * BLOCK_L, nheads * BLOCK_T, ngroups * BLOCK_T * BLOCK_N)
    scratch = torch.empty(batch * sum(sizes), dtype=torch.float32, device=dt.device)
    bc, weight, decay, c32 = scratch.split([batch * size for size in sizes])
    c32 = c32.view(batch, ngroups, BLOCK_T, BLOCK_N)
    head_tile = min(heads_per_program or VERIFY_HEAD_CHUNK, head_chunk(nheads // ngroups))
    _verify_coefficients_kernel[(batch, ngroups, nheads // ngroups // head_tile)](
        dt, A, B, C, dt_bias if dt_bias is not None else A, ring_B, ring_dt, state_indices, write_pos,
        query_start_loc, bc, weight, decay, c32,
        d_state, ring_len, max_query_len, pad_slot_id,
        *dt.stride(), *B.stride(), *C.stride(), *ring_B.stride(), *ring_dt.stride(),
        HEADS_PER_GROUP=nheads // ngroups, HEAD_CHUNK=head_tile, HAS_DT_BIAS=dt_bias is not None,
        DT_SOFTPLUS=dt_softplus, BLOCK_T=BLOCK_T, BLOCK_L=BLOCK_L, BLOCK_N=BLOCK_N, PDL=pdl,
        GDC=pdl and dt.device.type == "cuda", num_warps=num_warps or VERIFY_COEF_NUM_WARPS,
    )  # fmt: skip
    return bc, weight, decay, c32


def replay_verify(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    state: torch.Tensor,
    ring_x: torch.Tensor,
    ring_B: torch.Tensor,
    ring_dt: torch.Tensor,
    state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    *,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = True,
    pad_slot_id: int = PAD_SLOT_ID,
    out: torch.Tensor | None = None,
    block_p: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    maxnreg: int | None = None,
    mma_stages: int | None = None,
    mma_ring: bool | None = None,
    pdl: bool | None = None,
    coef_head_chunk: int | None = None,
    coef_num_warps: int | None = None,
    heads_per_program: int | None = None,
    tma: bool | None = None,
) -> torch.Tensor:
    """Append every row's query tokens to its ring at write_pos.. and return y [num_tokens, nheads, head_dim].

    x [num_tokens, nheads, head_dim] post-conv, the tokens of row r at query_start_loc[r]..query_start_loc[r+1]-1
    (int32 [batch + 1], vLLM's query_start_loc_d); dt [num_tokens, nheads] raw (or vLLM's head_dim expansion);
    B, C [num_tokens, ngroups, d_state]; state is the checkpoint to READ (never written); state_indices /
    write_pos int32 [batch]. ``max_query_len`` (1 + num_speculative_tokens) sizes the kernels, so it must be
    passed, not read from the metadata. Padding rows, rows with no tokens and rows that would not fit the
    ring are skipped (their ``out`` rows left as they were). Tuning knobs as in ``replay_decode``, ``maxnreg``
    (registers per thread of the output launch; 0: ptxas decides), ``mma_stages`` (the checkpoint reads on the
    tensor cores, pipelined that deep; 0: on the CUDA cores), ``mma_ring`` (the ring's product there too; needs
    ``mma_stages``) and ``pdl`` (the output launch as a programmatic dependent launch of the coefficient launch:
    its checkpoint reads, from the model's C, overlap that launch's end; it waits for the coefficients only; needs
    ``mma_stages``), the coefficient launch's ``coef_head_chunk`` and ``coef_num_warps`` (heads per program and
    warps; 0: the module's) and the output launch's ``heads_per_program`` (0 or 1: a program per head; n > 1: each
    program walks n heads of one group in one pipelined loop over their d_state tiles, so the next head's tiles load
    while this head's outputs form; needs ``mma_stages``, and n must divide the heads per group) and ``tma`` (the
    checkpoint tiles copied by Hopper's tensor memory accelerator through a descriptor, no per-element addresses;
    needs ``mma_stages``) (``launch_config.VerifyLaunch``); unset, the table's. The interpreter runs launches one
    after the other, so there PDL is only its form (the model's C), without the grid-dependency instructions.
    """
    check_launchable(x, state)
    nheads, head_dim = x.shape[1], x.shape[2]
    ngroups, d_state = B.shape[1], B.shape[2]
    dt, A, D, dt_bias, out = _step_inputs(x, dt, A, D, dt_bias, out)
    batch = state_indices.shape[0]
    if batch == 0 or x.shape[0] == 0:
        return out
    tuned = verify_launch_for(state.dtype, x.device)
    stages = tuned.mma_stages if mma_stages is None else mma_stages
    ring_on_tensor_cores = bool(tuned.mma_ring if mma_ring is None else mma_ring)
    dependent = bool(tuned.pdl if pdl is None else pdl)
    if ring_on_tensor_cores and not stages:
        raise ValueError("mma_ring needs mma_stages > 0: the ring's product adds into the tensor-core checkpoint reads")
    if dependent and not stages:
        raise ValueError("pdl needs mma_stages > 0: only the tensor-core checkpoint reads take the model's C")
    heads = max(1, tuned.heads_per_program if heads_per_program is None else heads_per_program)
    if heads > 1 and not stages:
        raise ValueError("heads_per_program > 1 needs mma_stages > 0: the heads' tiles share the pipelined loop")
    if (nheads // ngroups) % heads:
        raise ValueError(f"heads_per_program {heads} does not divide the {nheads // ngroups} heads of a group")
    copies = bool(tuned.tma if tma is None else tma)
    if copies and not stages:
        raise ValueError("tma needs mma_stages > 0: the copies feed the tensor-core checkpoint reads")
    ring_len = ring_len_of(ring_x)
    BLOCK_T = block_size(max_query_len)
    BLOCK_L = block_size(ring_len, floor=16)
    floor = DOT_EXTENT if stages else 1  # the masks cover what the head and d_state lack
    BLOCK_P = block_size(head_dim, cap=block_p or tuned.block_p, floor=floor)
    BLOCK_N = block_size(d_state, cap=block_n or tuned.block_n, floor=floor)
    gdc = dependent and x.device.type == "cuda"
    # made (or refused) before any launch writes the rings; unread without the knob
    descriptor = checkpoint_descriptor(state, BLOCK_P, BLOCK_N) if copies else state
    bc, weight, decay, c32 = verify_coefficients(
        dt, A, B, C, ring_B, ring_dt, state_indices, write_pos, query_start_loc, max_query_len,
        dt_bias=dt_bias, dt_softplus=dt_softplus, pad_slot_id=pad_slot_id, pdl=dependent,
        heads_per_program=tuned.coef_head_chunk if coef_head_chunk is None else coef_head_chunk,
        num_warps=tuned.coef_num_warps if coef_num_warps is None else coef_num_warps,
    )  # fmt: skip
    _verify_step_kernel[(triton.cdiv(head_dim, BLOCK_P), batch, nheads // heads)](
        x, C, c32, D if D is not None else A, state, descriptor, ring_x, state_indices, write_pos, query_start_loc,
        bc, weight, decay, out,
        head_dim, d_state, ring_len, max_query_len, nheads, nheads // ngroups, pad_slot_id,
        *x.stride(), *C.stride(), *state.stride(), *ring_x.stride(), *out.stride(),
        HAS_D=D is not None, BLOCK_T=BLOCK_T, BLOCK_L=BLOCK_L, BLOCK_P=BLOCK_P, BLOCK_N=BLOCK_N,
        N_TILES=triton.cdiv(d_state, BLOCK_N), C_STRIDE=c32.shape[-1],
        EVEN=head_dim % BLOCK_P == 0 and d_state % BLOCK_N == 0, TILE_T=max(BLOCK_T, floor),
        MMA_STAGES=stages, C_IN_TF32=C.dtype.itemsize <= 2, C_IN_BF16=C.dtype == torch.bfloat16,
        RING_MMA=ring_on_tensor_cores, RING_IN_TF32=ring_x.dtype.itemsize <= 2, PDL=dependent, GDC=gdc, HEADS=heads,
        TMA=copies, num_warps=num_warps or tuned.num_warps, launch_pdl=gdc,
        **register_cap(tuned.maxnreg if maxnreg is None else maxnreg),
    )  # fmt: skip
    return out


def replay_verify_reference(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    state: torch.Tensor,
    ring_x: torch.Tensor,
    ring_B: torch.Tensor,
    ring_dt: torch.Tensor,
    state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    *,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = True,
    pad_slot_id: int = PAD_SLOT_ID,
    out: torch.Tensor | None = None,
    block_p: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    maxnreg: int | None = None,
    mma_stages: int | None = None,
    mma_ring: bool | None = None,
    pdl: bool | None = None,
    coef_head_chunk: int | None = None,
    coef_num_warps: int | None = None,
    heads_per_program: int | None = None,
    tma: bool | None = None,
) -> torch.Tensor:
    """Plain-PyTorch twin of ``replay_verify`` (same arguments; the tuning knobs are ignored), in fp32, row by row."""
    del block_p, block_n, num_warps, maxnreg, mma_stages, mma_ring, pdl, coef_head_chunk, coef_num_warps
    del heads_per_program, tma
    nheads = x.shape[1]
    dt, A, D, dt_bias, out = _step_inputs(x, dt, A, D, dt_bias, out)
    ring_len = ring_len_of(ring_x)
    entries_x, entries_B, entries_dt = ring_entries(ring_x), ring_entries(ring_B), ring_entries(ring_dt)
    heads_group = group_of_head(nheads, B.shape[1], x.device)
    starts = query_start_loc.tolist()
    for row, (slot, pos) in enumerate(zip(state_indices.tolist(), write_pos.tolist(), strict=True)):
        first, count = starts[row], starts[row + 1] - starts[row]
        if slot == pad_slot_id or slot < 0 or pos < 0 or not 0 < count <= max_query_len or pos + count > ring_len:
            continue
        tokens = slice(first, first + count)
        step_dt = dt[tokens].float() + (dt_bias.float() if dt_bias is not None else 0.0)
        entries_x[slot, pos : pos + count] = x[tokens].to(ring_x.dtype)
        entries_B[slot, pos : pos + count] = B[tokens].to(ring_B.dtype)
        entries_dt[slot, pos : pos + count] = (softplus_reference(step_dt) if dt_softplus else step_dt).to(
            ring_dt.dtype
        )
        C_heads = C[tokens].float()[:, heads_group]  # [T, H, N]
        read = torch.einsum("hpn,thn->thp", state[slot].float(), C_heads)
        for j in range(count):
            seen = pos + j + 1  # entries 0..m+j
            entry_dt = entries_dt[slot, :seen].float()  # [S, H]
            weight = torch.exp(A.float() * decay_sum_after_reference(entry_dt, 0)) * entry_dt
            bc = torch.einsum("shn,hn->sh", entries_B[slot, :seen].float()[:, heads_group], C_heads[j])
            y = torch.einsum("sh,shp->hp", weight * bc, entries_x[slot, :seen].float())
            y += torch.exp(A.float() * entry_dt.sum(0))[:, None] * read[j]
            if D is not None:
                y += D.float()[:, None] * x[first + j].float()
            out[first + j] = y.to(out.dtype)
    return out


def replay_verify_step(
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
    fold_len: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    *,
    state_bf16: torch.Tensor | None = None,
    pad_slot_id: int = PAD_SLOT_ID,
    fold_list: tuple[torch.Tensor, torch.Tensor] | None = None,
    fold_launch: dict[str, Any] | None = None,
    **verify_kwargs: Any,
) -> torch.Tensor:
    """The verify step of a layer: rows with fold_len > 0 fold their committed entries [0, fold_len) into ssm_state
    (+ state_bf16) first (the builder gives them write_pos 0), then every row verifies, reading state_bf16 when
    given (else ssm_state). Three fixed-grid launches (fold, coefficients, outputs), so it can be graph-captured.
    ``fold_list``: (rows, count) of the folding rows, as the verify plan lists them (``flush_ring``'s work list);
    ``fold_launch``: the fold's tuning knobs (``flush_ring``'s; unset, the launch table's). Other keywords (D,
    dt_bias, dt_softplus, out, tuning knobs) as in ``replay_verify``."""
    flush_ring(ssm_state, ring_x, ring_B, ring_dt, A, state_indices, fold_len, state_bf16=state_bf16,
               pad_slot_id=pad_slot_id, work_list=fold_list, **(fold_launch or {}))  # fmt: skip
    read = state_bf16 if state_bf16 is not None else ssm_state
    return replay_verify(
        x, dt, A, B, C, read, ring_x, ring_B, ring_dt, state_indices, write_pos, query_start_loc, max_query_len,
        pad_slot_id=pad_slot_id, **verify_kwargs,
    )  # fmt: skip


def replay_verify_step_reference(
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
    fold_len: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    *,
    state_bf16: torch.Tensor | None = None,
    pad_slot_id: int = PAD_SLOT_ID,
    fold_list: tuple[torch.Tensor, torch.Tensor] | None = None,
    fold_launch: dict[str, Any] | None = None,
    **verify_kwargs: Any,
) -> torch.Tensor:
    """Plain-PyTorch twin of ``replay_verify_step`` (same arguments)."""
    del fold_list, fold_launch
    flush_ring_reference(ssm_state, ring_x, ring_B, ring_dt, A, state_indices, fold_len, state_bf16=state_bf16,
                         pad_slot_id=pad_slot_id)  # fmt: skip
    read = state_bf16 if state_bf16 is not None else ssm_state
    return replay_verify_reference(
        x, dt, A, B, C, read, ring_x, ring_B, ring_dt, state_indices, write_pos, query_start_loc, max_query_len,
        pad_slot_id=pad_slot_id, **verify_kwargs,
    )  # fmt: skip
