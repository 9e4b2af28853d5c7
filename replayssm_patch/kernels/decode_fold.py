"""The decode step's fold: the rows whose window ends this step, and only those, fold their ring into the master.

Why a launch of its own over a compacted row list: a flush is 1 row in L per step. Fused into the replay kernel
as a per-row branch, the fold had to run as a dependent FMA loop in 1-warp programs (a tensor-core tile there
costs every program its registers, flush or not), so each flushing row cost several rows' worth of time. Here
a fixed grid of 4-warp programs walks the (flush row, head, head_dim block) items of the rows the cursor plan
listed (``flush_rows``, the first ``flush_count`` entries): the grid is the same every step (CUDA graphs),
programs without items exit at once, and each item is one rank-(pos+1) product on tensor cores at fp32-level
error, measured in the tests against fp64 (``state_products.fp32_dot``: B from a 16-bit ring is exact in tf32, so
two tf32 products, x·w's tf32 head and its remainder, where tf32x3 takes three). Per item (row r, head h,
entries s = 0..pos, entry pos = this step):
    h' = decay * h_master + (X ⊙ w)ᵀ B          (fp32, written to the master and its bf16 copy)
    y  = h' · C_t + D * x_t                      (the flush row's output: the replay kernel skips these rows)
with w_s and decay from the coefficient launch, which also appended B_t to the ring.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from replayssm_patch.kernels.common import block_size
from replayssm_patch.kernels.layout import valid_rows
from replayssm_patch.kernels.state_products import fp32_dot

# ptxas (compile_check): 4 warps over [32 head_dim rows, 128 d_state columns] tiles take 146 registers without
# spills (148 with the bf16 copy; tf32x3 took 168); whole-head [64, 64] tiles spilled with the bf16 copy, and fp32
# FMA ("ieee") dots need 255.
FOLD_NUM_WARPS = 4
FOLD_BLOCK_P = 32
FOLD_BLOCK_N = 128
PROGRAMS_PER_SM = 3  # as many as the folds' 4-warp programs (146-189 registers) an SM holds


@triton.jit
def fold_work_item(item, rows_ptr, heads, BLOCKS: tl.constexpr):
    """(row, head, block) of a fold's work item: blocks fastest, then heads, then the listed flush rows."""
    return tl.load(rows_ptr + item // (BLOCKS * heads)), (item // BLOCKS) % heads, item % BLOCKS


@triton.jit(do_not_specialize_on_alignment=["x_ptr", "C_ptr", "out_ptr"])
def _decode_fold_kernel(
    x_ptr, C_ptr, D_ptr, master_ptr, copy_ptr, ring_x_ptr, ring_B_ptr,
    slot_ptr, pos_ptr, rows_ptr, count_ptr, w_ptr, decay_ptr, out_ptr,
    head_dim, d_state, nheads, heads_per_group,
    sx_b, sx_h, sx_p, sC_b, sC_g, sC_n, sm_slot, sm_h, sm_p, sm_n, sc_slot, sc_h, sc_p, sc_n,
    srx_slot, srx_h, srx_l, srx_p, srB_slot, srB_g, srB_l, srB_n, so_b, so_h, so_p,
    HAS_D: tl.constexpr, HAS_COPY: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_P: tl.constexpr,
    P_BLOCKS: tl.constexpr, BLOCK_N: tl.constexpr, N_TILES: tl.constexpr, B_IN_TF32: tl.constexpr,
):  # fmt: skip
    items = tl.load(count_ptr) * nheads * P_BLOCKS
    offs_l = tl.arange(0, BLOCK_L)
    item = tl.program_id(0)
    while item < items:  # a while loop: the item count lives on the device (grid-stride over the work list)
        row, head, pblock = fold_work_item(item, rows_ptr, nheads, P_BLOCKS)
        group = head // heads_per_group
        slot = tl.load(slot_ptr + row).to(tl.int64)
        pos = tl.load(pos_ptr + row)
        offs_p = pblock * BLOCK_P + tl.arange(0, BLOCK_P)
        mask_p = offs_p < head_dim
        x = tl.load(x_ptr + row * sx_b + head * sx_h + offs_p * sx_p, mask=mask_p, other=0.0).to(tl.float32)
        rx = ring_x_ptr + slot * srx_slot + head * srx_h
        xs = tl.load(
            rx + offs_l[:, None] * srx_l + offs_p[None, :] * srx_p,
            mask=(offs_l < pos)[:, None] & mask_p[None, :], other=0.0,
        ).to(tl.float32)  # fmt: skip
        xs = tl.where((offs_l == pos)[:, None], x[None, :], xs)
        weight = tl.load(w_ptr + (row * nheads + head) * BLOCK_L + offs_l)  # 0 past pos (coefficient launch)
        weighted_x = tl.trans(xs * weight[:, None])  # [P, L]
        decay = tl.load(decay_ptr + row * nheads + head)
        rB = ring_B_ptr + slot * srB_slot + group * srB_g
        C_row = C_ptr + row * sC_b + group * sC_g
        master = master_ptr + slot * sm_slot + head * sm_h
        y = tl.zeros((BLOCK_P,), dtype=tl.float32)
        for t in tl.static_range(N_TILES):
            offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
            mask_n = offs_n < d_state
            B = tl.load(
                rB + offs_l[:, None] * srB_l + offs_n[None, :] * srB_n,
                mask=(offs_l <= pos)[:, None] & mask_n[None, :], other=0.0,
            ).to(tl.float32)  # fmt: skip
            # C before the stores below: a load issued after a store waits for the store's data
            C = tl.load(C_row + offs_n * sC_n, mask=mask_n, other=0.0).to(tl.float32)
            mask_pn = mask_p[:, None] & mask_n[None, :]
            tile = offs_p[:, None] * sm_p + offs_n[None, :] * sm_n
            h = fp32_dot(weighted_x, B, decay * tl.load(master + tile, mask=mask_pn, other=0.0), False, B_IN_TF32)
            tl.store(master + tile, h.to(master_ptr.dtype.element_ty), mask=mask_pn)
            if HAS_COPY:
                copy = copy_ptr + slot * sc_slot + head * sc_h + offs_p[:, None] * sc_p + offs_n[None, :] * sc_n
                tl.store(copy, h.to(copy_ptr.dtype.element_ty), mask=mask_pn)
            y += tl.sum(h * C[None, :], axis=1)
        if HAS_D:
            y += tl.load(D_ptr + head).to(tl.float32) * x
        tl.store(out_ptr + row * so_b + head * so_h + offs_p * so_p, y.to(out_ptr.dtype.element_ty), mask=mask_p)
        item += tl.num_programs(0)


@dataclass(frozen=True)
class FoldPlan:
    """What a decode step's fold needs besides the replay's inputs: the fp32 master (and bf16 copy) it writes,
    the per-row flush lengths (rows > 0 are skipped by the replay) and the compacted list of those rows."""

    master: torch.Tensor
    state_bf16: torch.Tensor | None
    flush_len: torch.Tensor
    rows: torch.Tensor
    count: torch.Tensor


@functools.cache
def fold_programs(device: torch.device, per_sm: int = 0) -> int:
    """Programs of the fold's fixed grid: one resident wave of ``per_sm`` a multiprocessor (0: ``PROGRAMS_PER_SM``, as
    the launch tables' 0 says; a handful under the CPU interpreter)."""
    if device.type != "cuda":
        return 8
    return (per_sm or PROGRAMS_PER_SM) * torch.cuda.get_device_properties(device).multi_processor_count


def flush_work_list(
    flush_len: torch.Tensor, state_indices: torch.Tensor, write_pos: torch.Tensor, ring_len: int, pad_slot_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(flush_rows, flush_count) from a flush plan with device ops only (no sync, graph-safe): the rows that fold,
    in row order, then padding; for callers without the cursor plan's list (tests, benchmarks, the twin)."""
    folding = (flush_len > 0) & valid_rows(state_indices, pad_slot_id) & (write_pos >= 0) & (write_pos < ring_len)
    order = torch.argsort((~folding).to(torch.int8), stable=True)
    return order.to(torch.int32), folding.sum(dtype=torch.int32).reshape(1)


def launch_decode_fold(
    fold: FoldPlan,
    x: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    ring_x: torch.Tensor,
    ring_B: torch.Tensor,
    state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    weight: torch.Tensor,
    decay: torch.Tensor,
    out: torch.Tensor,
    block_l: int,
) -> None:
    """Fold the listed rows (after the coefficient launch, which wrote ``weight`` / ``decay`` and appended B_t)."""
    batch, nheads, head_dim = x.shape
    ngroups, d_state = C.shape[1], C.shape[2]
    BLOCK_P = block_size(head_dim, cap=FOLD_BLOCK_P, floor=16)
    BLOCK_N = block_size(d_state, cap=FOLD_BLOCK_N, floor=16)
    P_BLOCKS = triton.cdiv(head_dim, BLOCK_P)
    copy = fold.state_bf16 if fold.state_bf16 is not None else fold.master
    _decode_fold_kernel[(min(batch * nheads * P_BLOCKS, fold_programs(x.device)),)](
        x, C, D if D is not None else weight, fold.master, copy, ring_x, ring_B,
        state_indices, write_pos, fold.rows, fold.count, weight, decay, out,
        head_dim, d_state, nheads, nheads // ngroups,
        *x.stride(), *C.stride(), *fold.master.stride(), *copy.stride(), *ring_x.stride(), *ring_B.stride(),
        *out.stride(),
        HAS_D=D is not None, HAS_COPY=fold.state_bf16 is not None,
        BLOCK_L=block_l, BLOCK_P=BLOCK_P, P_BLOCKS=P_BLOCKS, BLOCK_N=BLOCK_N, N_TILES=triton.cdiv(d_state, BLOCK_N),
        B_IN_TF32=ring_B.dtype.itemsize <= 2, num_warps=FOLD_NUM_WARPS,
    )  # fmt: skip
