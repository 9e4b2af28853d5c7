"""One ReplaySSM decode step for a Gated DeltaNet layer: output-only replay, and the rank-L fold on flush rows.

Per (row, value head), with checkpoint S_c, ring entries s < m = write_pos holding (k̂_s, u_s, g_s), and
G_s = g summed over the entries after s up to and including this step (G_c: over all of them):
    base = e^G_c (S_c k̂) + Σ_s e^G_s (k̂_s·k̂) u_s          (= the decayed previous state times k̂)
    u    = β (v − base)                                     (the corrected value vLLM's step adds to the state)
    o    = e^G_c (S_c q̂) + Σ_s e^G_s (k̂_s·q̂) u_s + (k̂·q̂) u
and (k̂, u, g) is appended at m. That is exactly vLLM's step S' = e^g S, u = β (v − S' k̂), S = S' + u k̂ᵀ,
o = S q̂ unrolled over the ring. A non-flush row reads the checkpoint once for both products and writes only
its ring entry. A flush row (flush_len > 0; the builder sets it when the append fills the ring) instead folds
the whole ring, this step included, into a new checkpoint S_new and answers o = S_new q̂.

Split precision (``split``: ``GdnSplitTensors``): non-flush rows read the bf16 copy instead of S_c, half the
step's one big read, and also append β and the raw v; a flush row replays its window exactly on the fp32 master,
one step at a time (``gdn_common.replay_exact``: the copy's u never reaches the master), and refreshes the copy.
Outputs between flushes carry the copy's rounding (one bf16 ulp of S_c's share of o); the master does not.

Three launches with grids fixed by the shapes (CUDA graphs), as the Mamba-2 step (``decode_step``):
1. ``gdn_coefficients``, per (row, key head): q̂, k̂, the ring-key products and decay weights, computed once
   instead of in every value-head program; appends k̂ and g.
2. ``_gdn_replay_kernel``, per (head_v_dim block, value head, row), block fastest so the programs sharing a
   key head's scratch run together: the checkpoint tile [BLOCK_V, head_k_dim] is the one big read, u and o
   the products above; it appends u and skips flush rows. No fold code, so no program pays its registers. The
   tile's products with k̂ and q̂ are sums across lanes (182 of a 2-warp program's 968 sm_90a instructions are
   shuffles) or, with the launch table's ``replay_mma_stages``, the Mamba-2 verify's tensor-core reads
   (``state_products``: k̂ and q̂ as the columns of one operand, tf32x3; not yet timed on a GPU).
3. ``gdn_fold``: a fixed grid over the compacted list of flush rows (1 row in L per step).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_patch.kernels.common import block_size, check_launchable, decay_sum_after_reference
from replayssm_patch.kernels.decode_fold import flush_work_list
from replayssm_patch.kernels.gdn_coefficients import GdnCoefficients, launch_gdn_coefficients
from replayssm_patch.kernels.gdn_common import (
    default_scale,
    fold_reference,
    gdn_gates_reference,
    gdn_tiles_divide,
    l2_normalise_reference,
    replay_exact_reference,
    row_cursor,
)
from replayssm_patch.kernels.gdn_fold import launch_gdn_fold
from replayssm_patch.kernels.gdn_layout import GdnSplitTensors, require_fp32_checkpoint, split_kernel_tensors
from replayssm_patch.kernels.launch_config import GdnLaunch, gdn_launch_for
from replayssm_patch.kernels.layout import PAD_SLOT_ID, group_of_head, valid_rows
from replayssm_patch.kernels.state_products import DOT_EXTENT, checkpoint_reads_mma, checkpoint_tile

# Columns of the checkpoint per tensor-core product of the replay's MMA form: the Mamba-2 verify's winning tile
MMA_TILE_K = 32


@triton.jit
def _gdn_replay_kernel(
    v_ptr, state_ptr, ring_u_ptr, ring_v_ptr, slot_ptr, pos_ptr, flush_ptr,
    key_query_ptr, kk_ptr, kq_ptr, weight_ptr, decay_ptr, beta_ptr, out_ptr,
    head_k_dim, head_v_dim, ring_len, num_v_heads, v_per_k, pad_slot_id, s_query,
    sv_b, sv_h, sv_v, ss_slot, ss_h, ss_v, ss_k, sru_slot, sru_l, sru_h, sru_v, srv_slot, srv_l, srv_h, srv_v,
    so_b, so_h, so_v,
    BLOCK_L: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, EVEN: tl.constexpr,
    MMA_STAGES: tl.constexpr, TILE_K: tl.constexpr, TILE_T: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    vblock = tl.program_id(0)
    head = tl.program_id(1)
    row = tl.program_id(2)
    slot, pos, skip = row_cursor(slot_ptr, pos_ptr, row, pad_slot_id, ring_len)
    if skip | (tl.load(flush_ptr + row) > 0):  # the fold answers flush rows
        return
    offs_v = vblock * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_k = tl.arange(0, BLOCK_K)
    offs_l = tl.arange(0, BLOCK_L)
    mask_v = offs_v < head_v_dim
    mask_k = offs_k < head_k_dim
    # The checkpoint tile is the one big read, never written here: issue it first. Its products with k̂ and q̂ (k̂ at
    # key_query_ptr, q̂ s_query after it): sums across lanes, or (MMA_STAGES) the two vectors as the columns of one
    # tensor-core product per TILE_K columns of the tile, pipelined that deep.
    key = row * (num_v_heads // v_per_k) + head // v_per_k
    state_at = state_ptr + slot * ss_slot + head * ss_h + vblock * BLOCK_V * ss_v
    if MMA_STAGES > 0:
        reads = checkpoint_reads_mma(state_at, key_query_ptr + key * BLOCK_K, s_query, 1, 2, ss_v, ss_k, mask_v,
                                     head_k_dim, TILE_T, BLOCK_V, TILE_K, BLOCK_K // TILE_K, EVEN, MMA_STAGES,
                                     False, False)  # fmt: skip
        column = tl.arange(0, TILE_T)[None, :]  # k̂'s products in column 0, q̂'s in 1, the padding's 0 after
        state_k = tl.sum(tl.where(column == 0, reads, 0.0), axis=1)
        state_q = tl.sum(tl.where(column == 1, reads, 0.0), axis=1)
    else:
        state = checkpoint_tile(state_at, tl.arange(0, BLOCK_V)[:, None], offs_k[None, :], ss_v, ss_k,
                                mask_v[:, None], head_k_dim, EVEN)  # fmt: skip
        k = tl.load(key_query_ptr + key * BLOCK_K + offs_k, mask=mask_k, other=0.0)
        q = tl.load(key_query_ptr + s_query + key * BLOCK_K + offs_k, mask=mask_k, other=0.0)
        state = state.to(tl.float32)  # the split copy's bf16 is exact in fp32
        state_k, state_q = tl.sum(state * k[None, :], axis=1), tl.sum(state * q[None, :], axis=1)
    v_raw = tl.load(v_ptr + row * sv_b + head * sv_h + offs_v * sv_v, mask=mask_v, other=0.0)
    v = v_raw.to(tl.float32)
    per_head = row * num_v_heads + head
    weight = tl.load(weight_ptr + per_head * BLOCK_L + offs_l)
    ru_at = ring_u_ptr + slot * sru_slot + head * sru_h
    ring_u = tl.load(
        ru_at + offs_l[:, None] * sru_l + offs_v[None, :] * sru_v,
        mask=(offs_l < pos)[:, None] & mask_v[None, :], other=0.0,
    )  # fmt: skip
    decay = tl.load(decay_ptr + per_head)
    kk = tl.load(kk_ptr + key * BLOCK_L + offs_l)  # 0 from pos on
    kq = tl.load(kq_ptr + key * BLOCK_L + offs_l)  # k̂·q̂ at pos, 0 after; every load before the store below
    beta = tl.load(beta_ptr + per_head)
    base = decay * state_k + tl.sum((weight * kk)[:, None] * ring_u, axis=0)
    u = beta * (v - base)
    tl.store(ru_at + pos * sru_l + offs_v * sru_v, u, mask=mask_v)
    if SPLIT:  # the raw v, for the exact replay at the flush
        tl.store(ring_v_ptr + slot * srv_slot + pos * srv_l + head * srv_h + offs_v * srv_v, v_raw, mask=mask_v)
    o = decay * state_q + tl.sum((weight * kq)[:, None] * ring_u, axis=0)
    o += tl.sum(tl.where(offs_l == pos, kq, 0.0), axis=0) * u
    tl.store(out_ptr + row * so_b + head * so_h + offs_v * so_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)


def _out_buffer(v: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    return torch.empty_like(v) if out is None else out


def launch_gdn_replay(
    v: torch.Tensor,
    ssm_state: torch.Tensor,
    ring_u: torch.Tensor,
    state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    flush_len: torch.Tensor,
    coefficients: GdnCoefficients,
    pad_slot_id: int,
    out: torch.Tensor,
    launch: GdnLaunch,
    split: GdnSplitTensors | None = None,
) -> None:
    """The non-flush rows' u and o (after the coefficient launch); from the bf16 copy with ``split``."""
    batch, num_v_heads, head_v_dim = v.shape
    head_k_dim = ssm_state.shape[3]
    stages = launch.replay_mma_stages
    BLOCK_V = block_size(head_v_dim, cap=launch.replay_block_v, floor=DOT_EXTENT if stages else 1)
    c = coefficients
    checkpoint, ring_v, _ = split_kernel_tensors(split, ssm_state, ring_u, ring_u)  # the copy in split precision
    _gdn_replay_kernel[(triton.cdiv(head_v_dim, BLOCK_V), num_v_heads, batch)](
        v, checkpoint, ring_u, ring_v, state_indices, write_pos, flush_len,
        c.key_query, c.kk, c.kq, c.weight, c.decay, c.beta, out,
        head_k_dim, head_v_dim, ring_u.shape[1], num_v_heads, num_v_heads // c.num_k_heads, pad_slot_id,
        c.key_query.stride(0), *v.stride(), *checkpoint.stride(), *ring_u.stride(), *ring_v.stride(), *out.stride(),
        BLOCK_L=c.block_l, BLOCK_V=BLOCK_V, BLOCK_K=c.block_k,
        EVEN=gdn_tiles_divide(head_v_dim, BLOCK_V, head_k_dim, c.block_k), MMA_STAGES=stages,
        TILE_K=min(c.block_k, MMA_TILE_K), TILE_T=DOT_EXTENT, SPLIT=split is not None,
        num_warps=launch.replay_num_warps,
    )  # fmt: skip


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
    flush_rows: torch.Tensor | None = None,
    flush_count: torch.Tensor | None = None,
    scale: float | None = None,
    pad_slot_id: int = PAD_SLOT_ID,
    out: torch.Tensor | None = None,
    launch: GdnLaunch | None = None,
    split: GdnSplitTensors | None = None,
) -> torch.Tensor:
    """The whole GDN decode step (Triton): append (k̂, u, g) at write_pos, return o [batch, num_v_heads,
    head_v_dim] (the z gate and out_proj stay vLLM's), and fold the ring into ssm_state on flush rows (with
    ``split``, split precision: replay from its bf16 copy, append β and v too, flush by exact replay, refresh the copy).

    q, k [batch, num_k_heads, head_k_dim] and v [batch, num_v_heads, head_v_dim] are post-conv and not yet
    normalised (views into vLLM's mixed_qkv are fine); a, b [batch, num_v_heads] raw gate inputs; A_log,
    dt_bias [num_v_heads]; ssm_state [slots, num_v_heads, head_v_dim, head_k_dim] fp32 (else ValueError);
    ring tensors as in ``gdn_layout``; state_indices, write_pos, flush_len int [batch]: write_pos = entries
    already in the ring, flush_len > 0 = fold the ring including this step (``decode_flush_len`` gives L when
    write_pos == L-1) after which the row restarts at write_pos 0. ``flush_rows`` (int32 [batch]) and
    ``flush_count`` (int32 [1]) list the real flush rows first, in any order (the cursor plan writes them; when
    not given they are derived here with device ops). Padding rows (slot == pad_slot_id or < 0) and rows whose
    write_pos is off the ring are skipped: nothing read or written, ``out`` left as it was. Three launches with
    grids fixed by the shapes, so it can be captured in a CUDA graph. ``launch`` (the replay and fold launches'
    head_v_dim rows per program and warps; default: this GPU's tuned table, ``launch_config``) is a GPU tuning
    knob only.
    """
    check_launchable(q, ssm_state)
    require_fp32_checkpoint(ssm_state)
    batch, num_v_heads, _ = v.shape
    out = _out_buffer(v, out)
    if batch == 0:
        return out
    if flush_rows is None or flush_count is None:
        flush_rows, flush_count = flush_work_list(flush_len, state_indices, write_pos, ring_g.shape[1], pad_slot_id)
    scale = default_scale(q.shape[2]) if scale is None else scale
    coefficients = launch_gdn_coefficients(
        q, k, a, b, A_log, dt_bias, ring_k, ring_g, state_indices, write_pos, scale, pad_slot_id, num_v_heads,
        ring_beta=None if split is None else split.ring_beta,
    )  # fmt: skip
    launch = launch or gdn_launch_for(q.device)
    launch_gdn_replay(
        v, ssm_state, ring_u, state_indices, write_pos, flush_len, coefficients, pad_slot_id, out, launch, split
    )
    launch_gdn_fold(
        v, ssm_state, ring_k, ring_u, ring_g, state_indices, write_pos, flush_rows, flush_count, coefficients, out,
        launch, split,
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
    flush_rows: torch.Tensor | None = None,
    flush_count: torch.Tensor | None = None,
    scale: float | None = None,
    pad_slot_id: int = PAD_SLOT_ID,
    out: torch.Tensor | None = None,
    launch: GdnLaunch | None = None,
    split: GdnSplitTensors | None = None,
) -> torch.Tensor:
    """Plain-PyTorch twin of ``gdn_decode_step`` (same arguments; the fold list and tuning knobs are ignored),
    in fp32: the replay of every row, then the fold (with ``split``: the exact replay) of the flush rows, which
    answer from the folded state."""
    del flush_rows, flush_count, launch
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
    checkpoint = ssm_state if split is None else split.state_bf16
    state = torch.exp(all_g.sum(1))[:, :, None, None] * checkpoint[slots].float()  # [R, HV, V, K]
    base = torch.einsum("rhvk,rhk->rhv", state, k_hat)
    base += torch.einsum("rlh,rlhv->rhv", weight * torch.einsum("rlhk,rhk->rlh", old_k, k_hat), old_u)
    u = beta[:, :, None] * (v[rows].float() - base)
    ring_u[slots, pos] = u
    ring_g[slots, pos] = g
    ring_k[slots, pos] = k_keys
    if split is not None:
        split.ring_beta[slots, pos] = beta
        split.ring_v[slots, pos] = v[rows]

    o = torch.einsum("rhvk,rhk->rhv", state, q_hat)
    o += torch.einsum("rlh,rlhv->rhv", weight * torch.einsum("rlhk,rhk->rlh", old_k, q_hat), old_u)
    o += (k_hat * q_hat).sum(-1, keepdim=True) * u
    flushing = (flush_len[rows] > 0).nonzero().squeeze(1)
    if flushing.numel():
        fs, fp = slots[flushing], pos[flushing]
        now = torch.arange(ring_len, device=v.device)[None, :] == fp[:, None]
        all_u = torch.where(now[:, :, None, None], u[flushing, None], old_u[flushing])
        all_k = torch.where(now[:, :, None, None], k_hat[flushing, None], old_k[flushing])
        if split is None:
            folded = fold_reference(state[flushing], weight[flushing], all_u, all_k)
        else:
            folded = replay_exact_reference(
                ssm_state[fs], all_k, split.ring_v[fs], split.ring_beta[fs], all_g[flushing], fp + 1
            )  # fmt: skip
            split.state_bf16[fs] = folded.to(torch.bfloat16)
        ssm_state[fs] = folded
        o[flushing] = torch.einsum("rhvk,rhk->rhv", folded, q_hat[flushing])
    out[rows] = o.to(out.dtype)
    return out
