"""Fold the first flush_len ring entries of a GDN row into its checkpoint, outside a decode step.

The decode step folds its own ring on flush rows (``gdn_fold``); this is for materialise-before-prefill:
a prefill row that reads stored state (chunked prefill, a resumed sequence) first needs a current
checkpoint. With n = flush_len entries and G_s = g summed over the entries after s:
    S_new = e^(g_0 + ... + g_{n-1}) S_c + Σ_{s<n} e^G_s u_s k̂_sᵀ
a rank-n product per (row, value head, head_v_dim block). In split precision the n entries are replayed exactly
instead, one step at a time from (k̂, v, β, g) (``gdn_common.replay_exact``), and the bf16 copy is refreshed.
Rows with flush_len == 0 or a padding slot return at once; the ring is left as it is (the caller restarts the
row at write_pos 0).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_patch.kernels.common import block_size, check_launchable, decay_sum_after, decay_sum_after_reference
from replayssm_patch.kernels.gdn_common import fold_into, fold_reference, replay_exact, replay_exact_reference
from replayssm_patch.kernels.gdn_layout import GdnSplitTensors, require_fp32_checkpoint, split_kernel_tensors
from replayssm_patch.kernels.layout import PAD_SLOT_ID, group_of_head, valid_rows


# Before a prefill, the prefill rows' indices are a slice at the decode rows' offset: never specialise on its
# alignment, or a new batch composition can compile a new kernel while serving (as the decode kernels did).
@triton.jit(do_not_specialize_on_alignment=["slot_ptr", "len_ptr"])
def _gdn_flush_kernel(
    state_ptr, ring_k_ptr, ring_u_ptr, ring_g_ptr, slot_ptr, len_ptr, copy_ptr, ring_v_ptr, ring_beta_ptr,
    head_k_dim, head_v_dim, ring_len, v_per_k, pad_slot_id,
    ss_slot, ss_h, ss_v, ss_k, srk_slot, srk_l, srk_h, srk_k, sru_slot, sru_l, sru_h, sru_v, srg_slot, srg_l, srg_h,
    sc_slot, sc_h, sc_v, sc_k, srv_slot, srv_l, srv_h, srv_v, srb_slot, srb_l, srb_h,
    BLOCK_L: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    head = tl.program_id(1)
    vblock = tl.program_id(2)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    count = tl.minimum(tl.load(len_ptr + row), ring_len)
    if (slot == pad_slot_id) | (slot < 0) | (count <= 0):
        return
    khead = head // v_per_k
    offs_v = vblock * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_k = tl.arange(0, BLOCK_K)
    offs_l = tl.arange(0, BLOCK_L)
    mask_v = offs_v < head_v_dim
    mask_k = offs_k < head_k_dim
    mask_vk = mask_v[:, None] & mask_k[None, :]
    state_at = state_ptr + slot * ss_slot + head * ss_h + offs_v[:, None] * ss_v + offs_k[None, :] * ss_k
    state = tl.load(state_at, mask=mask_vk, other=0.0)
    rg_at = ring_g_ptr + slot * srg_slot + head * srg_h
    rk_at = ring_k_ptr + slot * srk_slot + khead * srk_h
    if SPLIT:
        state = replay_exact(
            state, rk_at, srk_l, srk_k, offs_k, mask_k, ring_v_ptr + slot * srv_slot + head * srv_h, srv_l, srv_v,
            offs_v, mask_v, ring_beta_ptr + slot * srb_slot + head * srb_h, srb_l, rg_at, srg_l, count, -1,
            tl.zeros((BLOCK_K,), dtype=tl.float32), tl.zeros((BLOCK_V,), dtype=tl.float32), 0.0, 0.0,
        )  # fmt: skip
        copy_at = copy_ptr + slot * sc_slot + head * sc_h + offs_v[:, None] * sc_v + offs_k[None, :] * sc_k
        tl.store(copy_at, state.to(copy_ptr.dtype.element_ty), mask=mask_vk)
    else:
        live = offs_l < count
        g = tl.load(rg_at + offs_l * srg_l, mask=live, other=0.0)
        weight = tl.where(live, tl.exp(decay_sum_after(g, offs_l)), 0.0)
        ring_k = tl.load(
            rk_at + offs_l[:, None] * srk_l + offs_k[None, :] * srk_k, mask=live[:, None] & mask_k[None, :], other=0.0
        )  # fmt: skip
        ring_u = tl.load(
            ring_u_ptr + slot * sru_slot + offs_l[:, None] * sru_l + head * sru_h + offs_v[None, :] * sru_v,
            mask=live[:, None] & mask_v[None, :], other=0.0,
        )  # fmt: skip
        state = fold_into(tl.exp(tl.sum(g, axis=0)) * state, ring_u, weight, ring_k)
    tl.store(state_at, state, mask=mask_vk)


def gdn_flush_ring(
    ssm_state: torch.Tensor,
    ring_k: torch.Tensor,
    ring_u: torch.Tensor,
    ring_g: torch.Tensor,
    state_indices: torch.Tensor,
    flush_len: torch.Tensor,
    *,
    pad_slot_id: int = PAD_SLOT_ID,
    block_v: int = 16,
    num_warps: int = 4,
    split: GdnSplitTensors | None = None,
) -> None:
    """Fold ring entries [0, flush_len) of each row into ssm_state in place (values above L count as L); with
    ``split``, replay them exactly and refresh the bf16 copy.

    ssm_state [slots, num_v_heads, head_v_dim, head_k_dim] fp32 (else ValueError); ring tensors as in
    ``gdn_layout``; state_indices, flush_len int [batch]. ``block_v`` and ``num_warps`` are GPU tuning only.
    """
    check_launchable(ssm_state, ring_u)
    require_fp32_checkpoint(ssm_state)
    num_v_heads, head_v_dim, head_k_dim = ssm_state.shape[1:]
    num_k_heads = ring_k.shape[2]
    batch = state_indices.shape[0]
    if batch == 0:
        return
    BLOCK_V = block_size(head_v_dim, cap=block_v, floor=16)
    copy, ring_v, ring_beta = split_kernel_tensors(split, ssm_state, ring_u, ring_g)
    _gdn_flush_kernel[(batch, num_v_heads, triton.cdiv(head_v_dim, BLOCK_V))](
        ssm_state, ring_k, ring_u, ring_g, state_indices, flush_len, copy, ring_v, ring_beta,
        head_k_dim, head_v_dim, ring_g.shape[1], num_v_heads // num_k_heads, pad_slot_id,
        *ssm_state.stride(), *ring_k.stride(), *ring_u.stride(), *ring_g.stride(),
        *copy.stride(), *ring_v.stride(), *ring_beta.stride(),
        BLOCK_L=block_size(ring_g.shape[1], floor=16), BLOCK_V=BLOCK_V, BLOCK_K=block_size(head_k_dim, floor=16),
        SPLIT=split is not None, num_warps=num_warps,
    )  # fmt: skip


def gdn_flush_ring_reference(
    ssm_state: torch.Tensor,
    ring_k: torch.Tensor,
    ring_u: torch.Tensor,
    ring_g: torch.Tensor,
    state_indices: torch.Tensor,
    flush_len: torch.Tensor,
    *,
    pad_slot_id: int = PAD_SLOT_ID,
    block_v: int = 16,
    num_warps: int = 4,
    split: GdnSplitTensors | None = None,
) -> None:
    """Plain-PyTorch twin of ``gdn_flush_ring`` (same arguments; block_v / num_warps are ignored), in fp32."""
    del block_v, num_warps
    require_fp32_checkpoint(ssm_state)
    num_v_heads, num_k_heads, ring_len = ssm_state.shape[1], ring_k.shape[2], ring_g.shape[1]
    rows = (valid_rows(state_indices, pad_slot_id) & (flush_len > 0)).nonzero().squeeze(1)
    if rows.numel() == 0:
        return
    slots, count = state_indices[rows].long(), flush_len[rows].long().clamp(max=ring_len)
    live = torch.arange(ring_len, device=ssm_state.device)[None, :] < count[:, None]  # [R, L]
    g = torch.where(live[:, :, None], ring_g[slots], 0.0)  # [R, L, HV]
    weight = torch.where(live[:, :, None], torch.exp(decay_sum_after_reference(g, 1)), 0.0)
    keys = ring_k[slots][:, :, group_of_head(num_v_heads, num_k_heads, ssm_state.device)]  # [R, L, HV, K]
    keys = torch.where(live[:, :, None, None], keys, 0.0)
    if split is not None:
        state = replay_exact_reference(ssm_state[slots], keys, split.ring_v[slots], split.ring_beta[slots], g, count)
        ssm_state[slots] = state
        split.state_bf16[slots] = state.to(torch.bfloat16)
        return
    values = torch.where(live[:, :, None, None], ring_u[slots], 0.0)  # [R, L, HV, V]
    state = torch.exp(g.sum(1))[:, :, None, None] * ssm_state[slots]
    ssm_state[slots] = fold_reference(state, weight, values, keys)
