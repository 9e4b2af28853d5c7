"""The GDN decode step's fold: the rows whose window ends this step, and only those, fold their ring into the state.

Why a launch of its own over a compacted row list (as ``decode_fold`` for Mamba-2): a flush is 1 row in L per
step. Compiled into every replay program, the rank-L product cost all of them its registers, flush or not.
Here a fixed grid of programs (the same every step, for CUDA graphs) walks the (flush row, value head,
head_v_dim block) items of the listed rows (``flush_rows``, the first ``flush_count`` entries); each item is
the replay's u, then one rank-(pos+1) product on tensor cores in tf32x3 (fp32-level error, tested against
fp64), with m = write_pos and the coefficients of ``gdn_decode``'s first launch:
    u     = β (v − e^G_c (S_c k̂) − Σ_{s<m} w_s kk_s u_s)
    S_new = e^G_c S_c + Σ_{s<=m} w_s u_s k̂_sᵀ          (stored as the new checkpoint; u_m = u, w_m = 1)
    o     = S_new q̂
The checkpoint tile is decayed before it is read, as vLLM's step decays its state, so with L = 1 (every step
a flush of an empty ring) the fold is vLLM's own recurrence. In split precision (``SPLIT``) an item instead replays
its window's pos+1 steps exactly on the fp32 tile (``gdn_common.replay_exact``; the ring's u came from the bf16
copy and must not reach the master) and writes the new checkpoint's bf16 copy beside it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_patch.kernels.common import block_size, register_cap
from replayssm_patch.kernels.decode_fold import fold_programs, fold_work_item
from replayssm_patch.kernels.gdn_coefficients import GdnCoefficients
from replayssm_patch.kernels.gdn_common import replay_exact
from replayssm_patch.kernels.gdn_layout import GdnSplitTensors, split_kernel_tensors
from replayssm_patch.kernels.launch_config import GdnLaunch
from replayssm_patch.kernels.state_products import fp32_dot


@triton.jit
def _gdn_fold_kernel(
    v_ptr, state_ptr, ring_k_ptr, ring_u_ptr, slot_ptr, pos_ptr, rows_ptr, count_ptr,
    qhat_ptr, khat_ptr, kk_ptr, weight_ptr, decay_ptr, beta_ptr, out_ptr,
    copy_ptr, ring_v_ptr, ring_beta_ptr, ring_g_ptr,
    head_k_dim, head_v_dim, num_v_heads, v_per_k,
    sv_b, sv_h, sv_v, ss_slot, ss_h, ss_v, ss_k,
    srk_slot, srk_l, srk_h, srk_k, sru_slot, sru_l, sru_h, sru_v, so_b, so_h, so_v,
    sc_slot, sc_h, sc_v, sc_k, srv_slot, srv_l, srv_h, srv_v, srb_slot, srb_l, srb_h, srg_slot, srg_l, srg_h,
    BLOCK_L: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, V_BLOCKS: tl.constexpr,
    SPLIT: tl.constexpr,
):  # fmt: skip
    items = tl.load(count_ptr) * num_v_heads * V_BLOCKS
    num_k_heads = num_v_heads // v_per_k
    offs_l = tl.arange(0, BLOCK_L)
    offs_k = tl.arange(0, BLOCK_K)
    mask_k = offs_k < head_k_dim
    item = tl.program_id(0)
    while item < items:  # a while loop: the item count lives on the device (grid-stride over the work list)
        row, head, vblock = fold_work_item(item, rows_ptr, num_v_heads, V_BLOCKS)
        khead = head // v_per_k
        slot = tl.load(slot_ptr + row).to(tl.int64)
        pos = tl.load(pos_ptr + row)
        offs_v = vblock * BLOCK_V + tl.arange(0, BLOCK_V)
        mask_v = offs_v < head_v_dim
        mask_vk = mask_v[:, None] & mask_k[None, :]
        state_at = state_ptr + slot * ss_slot + head * ss_h + offs_v[:, None] * ss_v + offs_k[None, :] * ss_k
        state = tl.load(state_at, mask=mask_vk, other=0.0)
        key = (row * num_k_heads + khead) * BLOCK_K + offs_k
        q = tl.load(qhat_ptr + key, mask=mask_k, other=0.0)
        v = tl.load(v_ptr + row * sv_b + head * sv_h + offs_v * sv_v, mask=mask_v, other=0.0).to(tl.float32)
        if SPLIT:  # this step's entry from the coefficient launch's scratch and ring_g (which it appended), and v
            per_head = row * num_v_heads + head
            rg_at = ring_g_ptr + slot * srg_slot + head * srg_h
            state = replay_exact(
                state, ring_k_ptr + slot * srk_slot + khead * srk_h, srk_l, srk_k, offs_k, mask_k,
                ring_v_ptr + slot * srv_slot + head * srv_h, srv_l, srv_v, offs_v, mask_v,
                ring_beta_ptr + slot * srb_slot + head * srb_h, srb_l, rg_at, srg_l, pos + 1, pos,
                tl.load(khat_ptr + key, mask=mask_k, other=0.0), v, tl.load(beta_ptr + per_head),
                tl.load(rg_at + pos * srg_l),
            )  # fmt: skip
            tl.store(state_at, state, mask=mask_vk)
            copy_at = copy_ptr + slot * sc_slot + head * sc_h + offs_v[:, None] * sc_v + offs_k[None, :] * sc_k
            tl.store(copy_at, state.to(copy_ptr.dtype.element_ty), mask=mask_vk)
        else:
            k = tl.load(khat_ptr + key, mask=mask_k, other=0.0)
            per_head = row * num_v_heads + head
            weight = tl.load(weight_ptr + per_head * BLOCK_L + offs_l)  # 0 past pos, 1 at pos
            kk = tl.load(kk_ptr + (row * num_k_heads + khead) * BLOCK_L + offs_l)  # 0 from pos on
            ru_at = ring_u_ptr + slot * sru_slot + head * sru_h
            ring_u = tl.load(
                ru_at + offs_l[:, None] * sru_l + offs_v[None, :] * sru_v,
                mask=(offs_l < pos)[:, None] & mask_v[None, :], other=0.0,
            )  # fmt: skip
            # the ring's keys with this step's (the coefficient launch wrote k̂ at pos; entries past pos are 0): loaded
            # before the u store below, as every load here, since a load issued after a store waits for its data
            keys = tl.load(
                ring_k_ptr + slot * srk_slot + khead * srk_h + offs_l[:, None] * srk_l + offs_k[None, :] * srk_k,
                mask=(offs_l <= pos)[:, None] & mask_k[None, :], other=0.0,
            )  # fmt: skip
            beta = tl.load(beta_ptr + per_head)
            state = tl.load(decay_ptr + per_head) * state  # e^G_c S_c: decayed to this step
            base = tl.sum(state * k[None, :], axis=1) + tl.sum((weight * kk)[:, None] * ring_u, axis=0)
            u = beta * (v - base)
            tl.store(ru_at + pos * sru_l + offs_v * sru_v, u, mask=mask_v)

            values = tl.where((offs_l == pos)[:, None], u[None, :], ring_u)  # the ring with this step appended
            state = fp32_dot(tl.trans(values * weight[:, None]), keys, state, False, False)  # fp32 keys: tf32x3
            tl.store(state_at, state, mask=mask_vk)
        o = tl.sum(state * q[None, :], axis=1)
        tl.store(out_ptr + row * so_b + head * so_h + offs_v * so_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
        item += tl.num_programs(0)


def launch_gdn_fold(
    v: torch.Tensor,
    ssm_state: torch.Tensor,
    ring_k: torch.Tensor,
    ring_u: torch.Tensor,
    ring_g: torch.Tensor,
    state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    flush_rows: torch.Tensor,
    flush_count: torch.Tensor,
    coefficients: GdnCoefficients,
    out: torch.Tensor,
    launch: GdnLaunch,
    split: GdnSplitTensors | None = None,
) -> None:
    """Fold the listed rows (after the coefficient launch, which wrote the scratch and appended k̂ and g, and β
    with ``split``, whose flush replays the window exactly and refreshes the copy)."""
    batch, num_v_heads, head_v_dim = v.shape
    head_k_dim = ssm_state.shape[3]
    if split is None:  # tl.dot needs 16 in every dimension
        block_v, num_warps, per_sm = launch.fold_block_v, launch.fold_num_warps, launch.fold_programs_per_sm
        BLOCK_V = block_size(head_v_dim, cap=block_v, floor=16)
    else:  # the exact replay has no tensor-core product
        block_v, num_warps, per_sm = launch.split_fold()
        BLOCK_V = block_size(head_v_dim, cap=block_v)
    V_BLOCKS = triton.cdiv(head_v_dim, BLOCK_V)
    c = coefficients
    programs = fold_programs(v.device, per_sm)
    copy, ring_v, ring_beta = split_kernel_tensors(split, ssm_state, ring_u, ring_g)
    _gdn_fold_kernel[(min(batch * num_v_heads * V_BLOCKS, programs),)](
        v, ssm_state, ring_k, ring_u, state_indices, write_pos, flush_rows, flush_count,
        c.q_hat, c.k_hat, c.kk, c.weight, c.decay, c.beta, out, copy, ring_v, ring_beta, ring_g,
        head_k_dim, head_v_dim, num_v_heads, num_v_heads // c.num_k_heads,
        *v.stride(), *ssm_state.stride(), *ring_k.stride(), *ring_u.stride(), *out.stride(),
        *copy.stride(), *ring_v.stride(), *ring_beta.stride(), *ring_g.stride(),
        BLOCK_L=c.block_l, BLOCK_V=BLOCK_V, BLOCK_K=c.block_k, V_BLOCKS=V_BLOCKS, SPLIT=split is not None,
        num_warps=num_warps, **register_cap(launch.fold_maxnreg),
    )  # fmt: skip
