"""The decode rows of a GDN step with prefills, in one launch: causal-conv update, coefficients, replay or fold.

Why a kernel of its own: a step with prefills runs eagerly (no CUDA graph holds 1,000+ tokens), so every launch is
Python on the host. On the H200 such steps were host-bound in both arms, and the decode step's four launches per
layer (vLLM's conv update, then ``gdn_decode``'s coefficients, replay and fold) made ReplaySSM's mixed step 25-29 %
longer than vLLM's, whose layer spends one launch on its decode rows (BENCHMARKS.md, sessions 13-14; with this
kernel, session 15: 0.94x the baseline's mixed step on one host, 1.30x with the four launches). Decode-only
steps replay a CUDA graph, where launches cost nothing and ``gdn_decode``'s split pays on the GPU; they keep it.

One program per (row, key head) owns everything that row and key head touch, so no two programs share a write:
the conv state of the key head's q and k channels and of its value heads' v channels, the ring entry at
write_pos, and its value heads' checkpoint tiles. It
1. runs the causal conv of its channels as vLLM's ``causal_conv1d_update`` does for one token (same sum order,
   products in the model dtype, fp32 accumulation from the bias, SiLU, the result rounded to the model dtype) and
   shifts their conv state;
2. computes q̂, k̂ and the ring-key products (``gdn_coefficients``' scratch, kept in registers) and appends k̂;
3. for each value head and head_v_dim block: u from the checkpoint and ring, appended; then either o from the
   checkpoint and ring (``gdn_decode``'s replay) or, on a flush row, the fold of the whole ring into a new
   checkpoint and o from it (``gdn_fold``): fp32 rank-1 updates, one per entry, which read the earlier entries
   again (from L2). A tensor-core product would need the ring's keys held as a tile through the loop: that took
   248 registers per thread (2 programs per SM), this 148.
In split precision (``SPLIT``) a non-flush row reads the bf16 copy instead of the checkpoint and also appends β and
v; a flush row replays its window exactly on the fp32 master (``gdn_common.replay_exact``, this step's entry from
registers) and writes the new checkpoint and its copy.
A row whose slot is padding or whose write_pos is off the ring is skipped entirely, its conv state included.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_patch.kernels.common import block_size, check_launchable, decay_sum_after
from replayssm_patch.kernels.gdn_common import append_key, default_scale, gdn_gates, replay_exact, row_cursor
from replayssm_patch.kernels.gdn_decode import gdn_decode_step_reference
from replayssm_patch.kernels.gdn_layout import (
    GdnSplitTensors,
    require_fp32_checkpoint,
    split_kernel_tensors,
    split_packed_qkv,
)
from replayssm_patch.kernels.layout import PAD_SLOT_ID, valid_rows

MIXED_BLOCK_V = 32  # head_v_dim rows per tile: 148 registers, no spill on sm_90 (16: 128 and a spill; compile_check)
MIXED_NUM_WARPS = 4
CONV_ACTIVATIONS = (None, "silu", "swish")  # vLLM's causal_conv1d_update accepts these (swish is silu)


@triton.jit
def _conv_step(
    x_row, conv_row, w_ptr, bias_ptr, channels, mask, sx_c, sc_c, sc_t, sw_c, sw_t,
    WIDTH: tl.constexpr, BLOCK_W: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
):  # fmt: skip
    """One token of the causal conv for ``channels``: the window is the conv state (WIDTH - 1 taps) then x; its
    state shifts by one. Returns the output in fp32, rounded to x's dtype first (vLLM stores it so)."""
    offs_t = tl.arange(0, BLOCK_W)
    taps = mask[None, :] & (offs_t < WIDTH)[:, None]
    x = tl.load(x_row + channels * sx_c, mask=mask, other=0.0)
    stored = tl.load(
        conv_row + channels[None, :] * sc_c + offs_t[:, None] * sc_t,
        mask=mask[None, :] & (offs_t < WIDTH - 1)[:, None], other=0.0,
    )  # fmt: skip
    window = tl.where((offs_t == WIDTH - 1)[:, None], x[None, :], stored)  # [BLOCK_W, channels]
    after = tl.load(
        conv_row + channels[None, :] * sc_c + (offs_t[:, None] + 1) * sc_t,
        mask=mask[None, :] & (offs_t + 1 < WIDTH - 1)[:, None], other=0.0,
    )  # fmt: skip
    shifted = tl.where((offs_t + 1 == WIDTH - 1)[:, None], x[None, :], after)
    weights = tl.load(w_ptr + channels[None, :] * sw_c + offs_t[:, None] * sw_t, mask=taps, other=0.0)
    # each product rounded to the model dtype, as vLLM's kernel multiplies (exact in fp32 first, then one rounding)
    products = (window.to(tl.float32) * weights.to(tl.float32)).to(x.dtype).to(tl.float32)
    if HAS_BIAS:
        acc = tl.load(bias_ptr + channels, mask=mask, other=0.0).to(tl.float32)
    else:
        acc = tl.zeros(x.shape, dtype=tl.float32)
    for tap in tl.static_range(WIDTH):  # tap by tap, in vLLM's order (a tree sum would round differently)
        acc += tl.sum(tl.where((offs_t == tap)[:, None], products, 0.0), axis=0)
    tl.debug_barrier()  # every read of the old state is done before any thread shifts it
    tl.store(
        conv_row + channels[None, :] * sc_c + offs_t[:, None] * sc_t, shifted,
        mask=mask[None, :] & (offs_t < WIDTH - 1)[:, None],
    )  # fmt: skip
    if SILU:
        acc = acc / (1 + tl.exp(-acc))
    return acc.to(x.dtype).to(tl.float32)


@triton.jit
def weight_at(weight, offs_l, s):
    """Entry s of a [BLOCK_L] register vector, as a scalar."""
    return tl.sum(tl.where(offs_l == s, weight, 0.0), axis=0)


@triton.jit
def _gdn_mixed_decode_kernel(
    x_ptr, conv_ptr, cw_ptr, cb_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr,
    state_ptr, ring_k_ptr, ring_u_ptr, ring_g_ptr, slot_ptr, pos_ptr, flush_ptr, out_ptr,
    copy_ptr, ring_v_ptr, ring_beta_ptr,
    scale, head_k_dim, head_v_dim, ring_len, pad_slot_id, k_channels, v_channels,
    sx_b, sx_c, sc_slot, sc_c, sc_t, sw_c, sw_t, sa_b, sa_h, sb_b, sb_h, ss_slot, ss_h, ss_v, ss_k,
    srk_slot, srk_l, srk_h, srk_k, sru_slot, sru_l, sru_h, sru_v, srg_slot, srg_l, srg_h, so_b, so_h, so_v,
    scp_slot, scp_h, scp_v, scp_k, srv_slot, srv_l, srv_h, srv_v, srb_slot, srb_l, srb_h,
    V_PER_K: tl.constexpr, WIDTH: tl.constexpr, BLOCK_W: tl.constexpr, HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
    V_BLOCKS: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    khead = tl.program_id(1)
    slot, pos, skip = row_cursor(slot_ptr, pos_ptr, row, pad_slot_id, ring_len)
    if skip:
        return
    x_row = x_ptr + row * sx_b
    conv_row = conv_ptr + slot * sc_slot
    offs_k = tl.arange(0, BLOCK_K)
    offs_l = tl.arange(0, BLOCK_L)
    mask_k = offs_k < head_k_dim
    earlier = offs_l < pos
    now = offs_l == pos

    q_channels = khead * head_k_dim + offs_k
    q = _conv_step(x_row, conv_row, cw_ptr, cb_ptr, q_channels, mask_k, sx_c, sc_c, sc_t, sw_c, sw_t,
                   WIDTH, BLOCK_W, HAS_BIAS, SILU)  # fmt: skip
    k = _conv_step(x_row, conv_row, cw_ptr, cb_ptr, k_channels + q_channels, mask_k, sx_c, sc_c, sc_t, sw_c, sw_t,
                   WIDTH, BLOCK_W, HAS_BIAS, SILU)  # fmt: skip
    rk_at = ring_k_ptr + slot * srk_slot + khead * srk_h
    q, k, kk, kq = append_key(q, k, scale, rk_at, srk_l, srk_k, offs_l, offs_k, mask_k, pos)
    kq_now = tl.sum(tl.where(now, kq, 0.0), axis=0)
    flush = tl.load(flush_ptr + row) > 0

    for j in tl.static_range(V_PER_K):
        head = khead * V_PER_K + j
        g, beta = gdn_gates(
            tl.load(a_ptr + row * sa_b + head * sa_h), tl.load(b_ptr + row * sb_b + head * sb_h),
            tl.load(A_log_ptr + head).to(tl.float32), tl.load(dt_bias_ptr + head).to(tl.float32),
        )  # fmt: skip
        rg_at = ring_g_ptr + slot * srg_slot + head * srg_h
        all_g = tl.where(now, g, tl.load(rg_at + offs_l * srg_l, mask=earlier, other=0.0))
        weight = tl.where(offs_l <= pos, tl.exp(decay_sum_after(all_g, offs_l)), 0.0)  # 1 at pos
        decay = tl.exp(tl.sum(all_g, axis=0))
        tl.store(rg_at + pos * srg_l, g)
        ru_at = ring_u_ptr + slot * sru_slot + head * sru_h
        for vblock in range(V_BLOCKS):  # a loop, not unrolled: each pass holds a fold
            offs_v = vblock * BLOCK_V + tl.arange(0, BLOCK_V)
            mask_v = offs_v < head_v_dim
            mask_vk = mask_v[:, None] & mask_k[None, :]
            v = _conv_step(x_row, conv_row, cw_ptr, cb_ptr, v_channels + head * head_v_dim + offs_v, mask_v,
                           sx_c, sc_c, sc_t, sw_c, sw_t, WIDTH, BLOCK_W, HAS_BIAS, SILU)  # fmt: skip
            state_at = state_ptr + slot * ss_slot + head * ss_h + offs_v[:, None] * ss_v + offs_k[None, :] * ss_k
            copy_at = copy_ptr + slot * scp_slot + head * scp_h + offs_v[:, None] * scp_v + offs_k[None, :] * scp_k
            if SPLIT:  # the copy on a non-flush row, the master on a flush row (a masked-off load reads nothing)
                master = tl.load(state_at, mask=mask_vk & flush, other=0.0)
                state = decay * tl.load(copy_at, mask=mask_vk & ~flush, other=0.0).to(tl.float32)
            else:
                state = decay * tl.load(state_at, mask=mask_vk, other=0.0)  # e^G_c S_c: decayed to this step
            ring_u = tl.load(
                ru_at + offs_l[:, None] * sru_l + offs_v[None, :] * sru_v,
                mask=earlier[:, None] & mask_v[None, :], other=0.0,
            )  # fmt: skip
            base = tl.sum(state * k[None, :], axis=1) + tl.sum((weight * kk)[:, None] * ring_u, axis=0)
            u = beta * (v - base)
            if SPLIT and vblock == 0:  # β for the exact replay at the flush, as the coefficient launch appends it
                tl.store(ring_beta_ptr + slot * srb_slot + pos * srb_l + head * srb_h, beta)
            if SPLIT and flush:  # the window replayed exactly from (k̂, v, β, g); this step's from registers
                folded = replay_exact(
                    master, rk_at, srk_l, srk_k, offs_k, mask_k, ring_v_ptr + slot * srv_slot + head * srv_h, srv_l,
                    srv_v, offs_v, mask_v, ring_beta_ptr + slot * srb_slot + head * srb_h, srb_l, rg_at, srg_l,
                    pos + 1, pos, k, v, beta, g,
                )  # fmt: skip
                tl.store(state_at, folded, mask=mask_vk)
                tl.store(copy_at, folded.to(copy_ptr.dtype.element_ty), mask=mask_vk)
                o = tl.sum(folded * q[None, :], axis=1)
            else:
                tl.store(ru_at + pos * sru_l + offs_v * sru_v, u, mask=mask_v)
                if SPLIT:  # the raw v, for the exact replay at the flush
                    rv_at = ring_v_ptr + slot * srv_slot + pos * srv_l + head * srv_h + offs_v * srv_v
                    tl.store(rv_at, v.to(ring_v_ptr.dtype.element_ty), mask=mask_v)
                if flush:
                    folded = state + (weight_at(weight, offs_l, pos) * u)[:, None] * k[None, :]  # this step's entry
                    # the earlier entries, one rank-1 update each, their rows read again from L2 (a while loop: the
                    # bound is a loaded value, which Triton's interpreter cannot take as a range)
                    s = 0
                    while s < pos:
                        u_s = tl.load(ru_at + s * sru_l + offs_v * sru_v, mask=mask_v, other=0.0)
                        k_s = tl.load(rk_at + s * srk_l + offs_k * srk_k, mask=mask_k, other=0.0)
                        folded += (weight_at(weight, offs_l, s) * u_s)[:, None] * k_s[None, :]
                        s += 1
                    tl.store(state_at, folded, mask=mask_vk)
                    o = tl.sum(folded * q[None, :], axis=1)
                else:
                    o = tl.sum(state * q[None, :], axis=1) + tl.sum((weight * kq)[:, None] * ring_u, axis=0)
                    o += kq_now * u
            out_at = out_ptr + row * so_b + head * so_h + offs_v * so_v
            tl.store(out_at, o.to(out_ptr.dtype.element_ty), mask=mask_v)


def gdn_mixed_decode(
    mixed_qkv: torch.Tensor,
    conv_state: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
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
    num_k_heads: int,
    head_k_dim: int,
    activation: str | None = "silu",
    scale: float | None = None,
    pad_slot_id: int = PAD_SLOT_ID,
    out: torch.Tensor,
    split: GdnSplitTensors | None = None,
) -> torch.Tensor:
    """The GDN decode step of ``gdn_decode_step`` for rows still before their causal conv, in one launch.

    mixed_qkv [batch, qkv_dim]: the rows' projections before the conv, q | k | v channels as vLLM's layer packs them
    (any row stride); conv_state [slots, qkv_dim, state_len >= width - 1] (vLLM's dim-first view), conv_weight
    [qkv_dim, width], conv_bias [qkv_dim] or None, ``activation`` as vLLM's ``causal_conv1d_update`` takes it. The
    rest, and ``out`` [batch, num_v_heads, head_v_dim], as ``gdn_decode_step``. The conv output is not written back
    to mixed_qkv (nothing reads a decode row's after the step).
    """
    check_launchable(mixed_qkv, ssm_state)
    require_fp32_checkpoint(ssm_state)
    if activation not in CONV_ACTIVATIONS:
        raise ValueError(f"causal conv activation {activation!r} is not one of {CONV_ACTIVATIONS}")
    batch = state_indices.shape[0]
    if batch == 0:
        return out
    num_v_heads, head_v_dim = out.shape[1], out.shape[2]
    width = conv_weight.shape[1]
    block_v = block_size(head_v_dim, cap=MIXED_BLOCK_V)
    k_channels = num_k_heads * head_k_dim
    copy, ring_v, ring_beta = split_kernel_tensors(split, ssm_state, ring_u, ring_g)
    _gdn_mixed_decode_kernel[(batch, num_k_heads)](
        mixed_qkv, conv_state, conv_weight, conv_bias, a, b, A_log, dt_bias,
        ssm_state, ring_k, ring_u, ring_g, state_indices, write_pos, flush_len, out, copy, ring_v, ring_beta,
        default_scale(head_k_dim) if scale is None else scale, head_k_dim, head_v_dim, ring_g.shape[1], pad_slot_id,
        k_channels, 2 * k_channels,
        *mixed_qkv.stride(), *conv_state.stride(), *conv_weight.stride(), *a.stride(), *b.stride(),
        *ssm_state.stride(), *ring_k.stride(), *ring_u.stride(), *ring_g.stride(), *out.stride(),
        *copy.stride(), *ring_v.stride(), *ring_beta.stride(),
        V_PER_K=num_v_heads // num_k_heads, WIDTH=width, BLOCK_W=block_size(width), HAS_BIAS=conv_bias is not None,
        SILU=activation is not None, BLOCK_L=block_size(ring_g.shape[1], floor=16),
        BLOCK_K=block_size(head_k_dim, floor=16), BLOCK_V=block_v, V_BLOCKS=triton.cdiv(head_v_dim, block_v),
        SPLIT=split is not None, num_warps=MIXED_NUM_WARPS,
    )  # fmt: skip
    return out


def causal_conv_update_reference(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    state_indices: torch.Tensor,
    activation: str | None,
) -> torch.Tensor:
    """PyTorch twin of one token of vLLM's ``causal_conv1d_update`` for the given rows (all valid): x [rows, dim]
    before the conv, conv_state [slots, dim, state_len]; shifts the rows' state, returns the output in x's dtype."""
    slots = state_indices.long()
    width = weight.shape[1]
    window = torch.cat([conv_state[slots, :, : width - 1], x[:, :, None].to(conv_state.dtype)], dim=2)
    acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    if bias is not None:
        acc += bias.float()
    for tap in range(width):  # tap by tap, products in the model dtype: the kernel's (and vLLM's) rounding
        acc += (window[:, :, tap] * weight[:, tap]).float()
    conv_state[slots, :, : width - 1] = window[:, :, 1:]
    return (torch.nn.functional.silu(acc) if activation is not None else acc).to(x.dtype)


def gdn_mixed_decode_reference(
    mixed_qkv: torch.Tensor,
    conv_state: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
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
    num_k_heads: int,
    head_k_dim: int,
    activation: str | None = "silu",
    scale: float | None = None,
    pad_slot_id: int = PAD_SLOT_ID,
    out: torch.Tensor,
    split: GdnSplitTensors | None = None,
) -> torch.Tensor:
    """Plain-PyTorch twin of ``gdn_mixed_decode`` (same arguments): the conv of the rows the step runs, then
    ``gdn_decode_step_reference``."""
    ring_len = ring_g.shape[1]
    runs = valid_rows(state_indices, pad_slot_id) & (write_pos >= 0) & (write_pos < ring_len)
    rows = runs.nonzero().squeeze(1)
    qkv = mixed_qkv.clone()
    qkv[rows] = causal_conv_update_reference(
        mixed_qkv[rows], conv_state, conv_weight, conv_bias, state_indices[rows], activation
    )
    q, k, v = split_packed_qkv(qkv, num_k_heads, head_k_dim, out.shape[1], out.shape[2])
    return gdn_decode_step_reference(
        q, k, v, a, b, A_log, dt_bias, ssm_state, ring_k, ring_u, ring_g, state_indices, write_pos, flush_len,
        scale=scale, pad_slot_id=pad_slot_id, out=out, split=split,
    )  # fmt: skip
