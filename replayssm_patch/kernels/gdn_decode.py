"""One ReplaySSM decode step for a Gated DeltaNet layer: output-only replay, and the rank-L fold on flush rows.

Per (row, value head), with checkpoint S_c, ring entries s < m = write_pos holding (k̂_s, u_s, g_s), and
G_s = g summed over the entries after s up to and including this step (G_c: over all of them):
    base = e^G_c (S_c k̂) + Σ_s e^G_s (k̂_s·k̂) u_s          (= the decayed previous state times k̂)
    u    = β (v − base)                                     (the corrected value vLLM's step adds to the state)
    o    = e^G_c (S_c q̂) + Σ_s e^G_s (k̂_s·q̂) u_s + (k̂·q̂) u
and (k̂, u, g) is appended at m. That is exactly vLLM's step S' = e^g S, u = β (v − S' k̂), S = S' + u k̂ᵀ,
o = S q̂ unrolled over the ring. A non-flush row reads the checkpoint once for both products and writes only
its ring entry. A flush row (flush_len > 0; the builder sets it when the append fills the ring) also folds
the whole ring, this step included, in the same program: S_new = e^G_c S_c + Σ_{s<=m} e^G_s u_s k̂_sᵀ, a
rank-(m+1) product against the checkpoint tile already in registers, stored as the new checkpoint; o is
then S_new q̂. The decay e^G_c is applied to the checkpoint tile before the products, as vLLM decays its
state before reading it, so with L = 1 (every step a flush, empty ring) the step is vLLM's own recurrence.

One program per (row, value head, head_v_dim block); each holds the [BV, head_k_dim] checkpoint tile. Only
the first V block of a head stores g, and only the first value head of each key head stores k̂; programs
read ring entries before write_pos only, so those stores at write_pos cannot race, and a reused slot's stale
(even non-finite) entries are never read.
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
)
from replayssm_patch.kernels.gdn_common import (
    default_scale,
    fold_into,
    fold_reference,
    gdn_gates,
    gdn_gates_reference,
    l2_normalise,
    l2_normalise_reference,
)
from replayssm_patch.kernels.gdn_layout import require_fp32_checkpoint
from replayssm_patch.kernels.layout import PAD_SLOT_ID, group_of_head, valid_rows


@triton.jit
def _gdn_decode_step_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr,
    state_ptr, ring_k_ptr, ring_u_ptr, ring_g_ptr, slot_ptr, pos_ptr, flush_ptr, out_ptr,
    scale, head_k_dim, head_v_dim, ring_len, v_per_k, pad_slot_id,
    sq_b, sq_h, sq_k, sk_b, sk_h, sk_k, sv_b, sv_h, sv_v, sa_b, sa_h, sb_b, sb_h,
    ss_slot, ss_h, ss_v, ss_k,
    srk_slot, srk_l, srk_h, srk_k, sru_slot, sru_l, sru_h, sru_v, srg_slot, srg_l, srg_h,
    so_b, so_h, so_v,
    BLOCK_L: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    head = tl.program_id(1)
    vblock = tl.program_id(2)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    if (slot == pad_slot_id) | (slot < 0) | (pos < 0) | (pos >= ring_len):  # padding, or a cursor off the ring
        return
    khead = head // v_per_k
    offs_v = vblock * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_k = tl.arange(0, BLOCK_K)
    offs_l = tl.arange(0, BLOCK_L)
    mask_v = offs_v < head_v_dim
    mask_k = offs_k < head_k_dim
    mask_vk = mask_v[:, None] & mask_k[None, :]
    # The checkpoint tile is the one big read: issue it first so its latency hides behind the ring math.
    state_at = state_ptr + slot * ss_slot + head * ss_h + offs_v[:, None] * ss_v + offs_k[None, :] * ss_k
    state = tl.load(state_at, mask=mask_vk, other=0.0)

    q = tl.load(q_ptr + row * sq_b + khead * sq_h + offs_k * sq_k, mask=mask_k, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + row * sk_b + khead * sk_h + offs_k * sk_k, mask=mask_k, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + row * sv_b + head * sv_h + offs_v * sv_v, mask=mask_v, other=0.0).to(tl.float32)
    q = l2_normalise(q) * scale
    k = l2_normalise(k)
    g, beta = gdn_gates(
        tl.load(a_ptr + row * sa_b + head * sa_h), tl.load(b_ptr + row * sb_b + head * sb_h),
        tl.load(A_log_ptr + head).to(tl.float32), tl.load(dt_bias_ptr + head).to(tl.float32),
    )  # fmt: skip

    # Earlier ring entries (positions < write_pos); masked loads never touch stale or non-finite entries.
    earlier = offs_l < pos
    rg_at = ring_g_ptr + slot * srg_slot + head * srg_h
    rk_at = ring_k_ptr + slot * srk_slot + khead * srk_h
    ru_at = ring_u_ptr + slot * sru_slot + head * sru_h
    all_g = tl.where(offs_l == pos, g, tl.load(rg_at + offs_l * srg_l, mask=earlier, other=0.0))
    weight = tl.where(offs_l <= pos, tl.exp(decay_sum_after(all_g, offs_l)), 0.0)
    ring_k = tl.load(
        rk_at + offs_l[:, None] * srk_l + offs_k[None, :] * srk_k, mask=earlier[:, None] & mask_k[None, :], other=0.0
    )  # fmt: skip
    ring_u = tl.load(
        ru_at + offs_l[:, None] * sru_l + offs_v[None, :] * sru_v, mask=earlier[:, None] & mask_v[None, :], other=0.0
    )  # fmt: skip
    state = tl.exp(tl.sum(all_g, axis=0)) * state  # e^G_c S_c: decayed to this step
    kk = tl.sum(ring_k * k[None, :], axis=1)
    base = tl.sum(state * k[None, :], axis=1) + tl.sum((weight * kk)[:, None] * ring_u, axis=0)
    u = beta * (v - base)

    tl.store(ru_at + pos * sru_l + offs_v * sru_v, u, mask=mask_v)
    first_block = vblock == 0
    tl.store(rg_at + pos * srg_l, g, mask=first_block)
    key_leader = first_block & (head % v_per_k == 0)
    tl.store(rk_at + pos * srk_l + offs_k * srk_k, k, mask=mask_k & key_leader)

    if tl.load(flush_ptr + row) > 0:
        now = offs_l == pos
        state = fold_into(
            state, tl.where(now[:, None], u[None, :], ring_u), weight, tl.where(now[:, None], k[None, :], ring_k)
        )  # fmt: skip
        tl.store(state_at, state, mask=mask_vk)
        o = tl.sum(state * q[None, :], axis=1)
    else:
        kq = tl.sum(ring_k * q[None, :], axis=1)
        o = tl.sum(state * q[None, :], axis=1) + tl.sum((weight * kq)[:, None] * ring_u, axis=0)
        o += tl.sum(k * q, axis=0) * u
    tl.store(out_ptr + row * so_b + head * so_h + offs_v * so_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)


def _out_buffer(v: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    return torch.empty_like(v) if out is None else out


def gdn_decode_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_state: torch.Tensor,
    ring_k: torch.Tensor,
    ring_u: torch.Tensor,
    ring_g: torch.Tensor,
    state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    flush_len: torch.Tensor,
    *,
    scale: float | None = None,
    pad_slot_id: int = PAD_SLOT_ID,
    out: torch.Tensor | None = None,
    block_v: int = 16,
    num_warps: int = 4,
) -> torch.Tensor:
    """The whole GDN decode step (Triton): append (k̂, u, g) at write_pos, return o [batch, num_v_heads,
    head_v_dim] (the z gate and out_proj stay vLLM's), and fold the ring into ssm_state on flush rows.

    q, k [batch, num_k_heads, head_k_dim] and v [batch, num_v_heads, head_v_dim] are post-conv and not yet
    normalised (views into vLLM's mixed_qkv are fine); a, b [batch, num_v_heads] raw gate inputs; A_log,
    dt_bias [num_v_heads]; ssm_state [slots, num_v_heads, head_v_dim, head_k_dim] fp32 (else ValueError);
    ring tensors as in ``gdn_layout``; state_indices, write_pos, flush_len int [batch]: write_pos = entries
    already in the ring, flush_len > 0 = fold the ring including this step (``decode_flush_len`` gives L when
    write_pos == L-1) after which the row restarts at write_pos 0. Padding rows (slot == pad_slot_id or < 0)
    and rows whose write_pos is off the ring are skipped: nothing read or written, ``out`` left as it was.
    One launch with a grid fixed by the shapes, so it can be captured in a CUDA graph. ``block_v`` (at least
    16, for the fold's tl.dot) and ``num_warps`` are GPU tuning knobs only; the fp32 fold is register hungry
    (see ``compile_check``), and no H200 sweep has chosen them yet.
    """
    check_launchable(q, ssm_state)
    require_fp32_checkpoint(ssm_state)
    batch, num_v_heads, head_v_dim = v.shape
    num_k_heads, head_k_dim = q.shape[1:]
    out = _out_buffer(v, out)
    if batch == 0:
        return out
    BLOCK_V = block_size(head_v_dim, cap=block_v, floor=16)  # tl.dot (the fold) needs 16 in every dimension
    grid = (batch, num_v_heads, triton.cdiv(head_v_dim, BLOCK_V))
    _gdn_decode_step_kernel[grid](
        q, k, v, a, b, A_log, dt_bias, ssm_state, ring_k, ring_u, ring_g, state_indices, write_pos, flush_len, out,
        default_scale(head_k_dim) if scale is None else scale, head_k_dim, head_v_dim, ring_g.shape[1],
        num_v_heads // num_k_heads, pad_slot_id,
        *q.stride(), *k.stride(), *v.stride(), *a.stride(), *b.stride(), *ssm_state.stride(),
        *ring_k.stride(), *ring_u.stride(), *ring_g.stride(), *out.stride(),
        BLOCK_L=block_size(ring_g.shape[1], floor=16), BLOCK_V=BLOCK_V, BLOCK_K=block_size(head_k_dim, floor=16),
        num_warps=num_warps,
    )  # fmt: skip
    return out


def gdn_decode_step_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_state: torch.Tensor,
    ring_k: torch.Tensor,
    ring_u: torch.Tensor,
    ring_g: torch.Tensor,
    state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    flush_len: torch.Tensor,
    *,
    scale: float | None = None,
    pad_slot_id: int = PAD_SLOT_ID,
    out: torch.Tensor | None = None,
    block_v: int = 16,
    num_warps: int = 4,
) -> torch.Tensor:
    """Plain-PyTorch twin of ``gdn_decode_step`` (same arguments; block_v / num_warps are ignored), in fp32."""
    del block_v, num_warps
    require_fp32_checkpoint(ssm_state)
    num_v_heads, num_k_heads, head_k_dim = v.shape[1], q.shape[1], q.shape[2]
    out = _out_buffer(v, out)
    ring_len = ring_g.shape[1]
    on_ring = (write_pos >= 0) & (write_pos < ring_len)
    rows = (valid_rows(state_indices, pad_slot_id) & on_ring).nonzero().squeeze(1)
    if rows.numel() == 0:
        return out
    slots, pos = state_indices[rows].long(), write_pos[rows].long()
    key_of = group_of_head(num_v_heads, num_k_heads, v.device)
    scale = default_scale(head_k_dim) if scale is None else scale
    q_hat = (l2_normalise_reference(q[rows].float()) * scale)[:, key_of]  # [R, HV, K]
    k_keys = l2_normalise_reference(k[rows].float())  # [R, HK, K]
    k_hat = k_keys[:, key_of]
    g, beta = gdn_gates_reference(a[rows], b[rows], A_log, dt_bias)  # [R, HV]

    positions = torch.arange(ring_len, device=v.device)[None, :]
    earlier, upto = positions < pos[:, None], positions <= pos[:, None]  # [R, L]
    all_g = torch.where(earlier[:, :, None], ring_g[slots], 0.0)
    all_g[torch.arange(len(rows)), pos] = g
    weight = torch.where(upto[:, :, None], torch.exp(decay_sum_after_reference(all_g, 1)), 0.0)  # [R, L, HV]
    old_k = torch.where(earlier[:, :, None, None], ring_k[slots][:, :, key_of], 0.0)  # [R, L, HV, K]
    old_u = torch.where(earlier[:, :, None, None], ring_u[slots], 0.0)  # [R, L, HV, V]
    state = torch.exp(all_g.sum(1))[:, :, None, None] * ssm_state[slots]  # [R, HV, V, K]
    base = torch.einsum("rhvk,rhk->rhv", state, k_hat)
    base += torch.einsum("rlh,rlhv->rhv", weight * torch.einsum("rlhk,rhk->rlh", old_k, k_hat), old_u)
    u = beta[:, :, None] * (v[rows].float() - base)
    ring_u[slots, pos] = u
    ring_g[slots, pos] = g
    ring_k[slots, pos] = k_keys

    o = torch.einsum("rhvk,rhk->rhv", state, q_hat)
    o += torch.einsum("rlh,rlhv->rhv", weight * torch.einsum("rlhk,rhk->rlh", old_k, q_hat), old_u)
    o += (k_hat * q_hat).sum(-1, keepdim=True) * u
    flushing = (flush_len[rows] > 0).nonzero().squeeze(1)
    if flushing.numel():
        fs, fp = slots[flushing], pos[flushing]
        now = torch.arange(ring_len, device=v.device)[None, :] == fp[:, None]
        all_u = torch.where(now[:, :, None, None], u[flushing, None], old_u[flushing])
        all_k = torch.where(now[:, :, None, None], k_hat[flushing, None], old_k[flushing])
        folded = fold_reference(state[flushing], weight[flushing], all_u, all_k)
        ssm_state[fs] = folded
        o[flushing] = torch.einsum("rhvk,rhk->rhv", folded, q_hat[flushing])
    out[rows] = o.to(out.dtype)
    return out
