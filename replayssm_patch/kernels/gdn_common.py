"""Pieces the GDN ReplaySSM kernels and their PyTorch twins share: normalisation, gates, the rank-L fold.

The formulas are those of vLLM 0.24's GDN decode (so a ring entry holds what the baseline step computes):
    k̂ = k / sqrt(|k|² + 1e-6);  q̂ = q / sqrt(|q|² + 1e-6) · scale;  g = −e^A_log · softplus(a + dt_bias);
    β = sigmoid(b) rounded to b's dtype (vLLM's packed decode kernel rounds it so; its mixed-step kernel does
    not, and the replay path handles both kinds of step, so it follows the default pure-decode path).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_patch.kernels.common import softplus_f32, softplus_reference

L2_EPS = 1e-6


def default_scale(head_k_dim: int) -> float:
    """vLLM's query scale for GDN: head_k_dim ** -0.5."""
    return head_k_dim**-0.5


@triton.jit
def l2_normalise(x):
    """x / sqrt(|x|² + 1e-6) for a 1-D fp32 block (masked lanes must be 0)."""
    return x / tl.sqrt(tl.sum(x * x, axis=0) + 1e-6)


@triton.jit
def row_cursor(slot_ptr, pos_ptr, row, pad_slot_id, ring_len):
    """A decode row's slot and write position (int64), and whether the step skips it: padding, or a cursor off
    the ring."""
    slot = tl.load(slot_ptr + row).to(tl.int64)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    return slot, pos, (slot == pad_slot_id) | (slot < 0) | (pos < 0) | (pos >= ring_len)


@triton.jit
def key_products(q, k, scale, rk_at, srk_l, srk_k, offs_l, offs_k, mask_k, pos):
    """Normalise one (row, key head)'s q and k (fp32 [BLOCK_K], masked lanes 0) and read its ring keys before pos.
    Returns q̂ (scaled), k̂, kk_s = k̂_s·k̂ and kq_s = k̂_s·q̂ for s < pos, and kq_pos = k̂·q̂ (both 0 after pos). Loads
    only: the caller appends k̂ at pos (``append_key``, or after its own last load)."""
    q = l2_normalise(q) * scale
    k = l2_normalise(k)
    earlier, now = offs_l < pos, offs_l == pos
    ring_k = tl.load(
        rk_at + offs_l[:, None] * srk_l + offs_k[None, :] * srk_k, mask=earlier[:, None] & mask_k[None, :], other=0.0
    )  # fmt: skip
    kk = tl.sum(ring_k * k[None, :], axis=1)
    kq = tl.where(now, tl.sum(k * q, axis=0), tl.sum(ring_k * q[None, :], axis=1))
    return q, k, kk, kq


@triton.jit
def append_key(q, k, scale, rk_at, srk_l, srk_k, offs_l, offs_k, mask_k, pos):
    """``key_products``, and k̂ appended to the ring at pos at once."""
    q, k, kk, kq = key_products(q, k, scale, rk_at, srk_l, srk_k, offs_l, offs_k, mask_k, pos)
    tl.store(rk_at + pos * srk_l + offs_k * srk_k, k, mask=mask_k)
    return q, k, kk, kq


def gdn_tiles_divide(head_v_dim: int, block_v: int, head_k_dim: int, block_k: int) -> bool:
    """Whether a launch's [block_v, block_k] state tiles cover the head exactly (``checkpoint_tile``'s EVEN)."""
    return head_v_dim % block_v == 0 and head_k_dim == block_k


@triton.jit
def gdn_gates(a_raw, b_raw, A_log, dt_bias):
    """(g, β) of one (row, value head): log-decay g <= 0 and the write strength β in (0, 1), both fp32."""
    g = -tl.exp(A_log) * softplus_f32(a_raw.to(tl.float32) + dt_bias)
    beta = tl.sigmoid(b_raw.to(tl.float32)).to(b_raw.dtype).to(tl.float32)
    return g, beta


@triton.jit
def fold_into(state, ring_u, weight, ring_k):
    """state [BV, BK] + Σ_s weight_s u_s k̂_sᵀ, as one [BV, L] × [L, BK] product in full fp32 (no tf32).

    Entries with weight 0 must also hold finite u and k̂ (masked loads give 0): 0 · NaN would poison the sum.
    """
    return state + tl.dot(tl.trans(ring_u * weight[:, None]), ring_k, input_precision="ieee")


@triton.jit
def window_entry(rk_at, srk_l, srk_k, offs_k, mask_k, rv_at, srv_l, srv_v, offs_v, mask_v, rb_at, srb_l, rg_at, srg_l,
                 s, count, now, k_now, v_now, beta_now, g_now):  # fmt: skip
    """Ring entry s of a window of ``count``: (k̂, v, β, g), the *_now values at ``now``, zeros past count (loads
    masked off at both)."""
    live = (s < count) & (s != now)
    k = tl.load(rk_at + s * srk_l + offs_k * srk_k, mask=mask_k & live, other=0.0)
    v = tl.load(rv_at + s * srv_l + offs_v * srv_v, mask=mask_v & live, other=0.0).to(tl.float32)
    beta = tl.load(rb_at + s * srb_l, mask=live, other=0.0)
    g = tl.load(rg_at + s * srg_l, mask=live, other=0.0)
    at_now = s == now
    return (tl.where(at_now, k_now, k), tl.where(at_now, v_now, v), tl.where(at_now, beta_now, beta),
            tl.where(at_now, g_now, g))  # fmt: skip


@triton.jit
def replay_exact(
    state, rk_at, srk_l, srk_k, offs_k, mask_k, rv_at, srv_l, srv_v, offs_v, mask_v, rb_at, srb_l, rg_at, srg_l,
    count, now, k_now, v_now, beta_now, g_now,
):  # fmt: skip
    """A split-precision flush: window entries [0, count) replayed one at a time on the fp32 state tile [BV, BK] as
    vLLM's step computes them, S = e^g S, u = β (v − S k̂), S += u k̂ᵀ, so the master never reads the bf16 copy
    (whose u only answered the window's outputs). Entry ``now`` is this step's, (k_now [BK], v_now [BV], β, g), held
    by the caller and not read from the ring (−1: none). The *_at pointers: the entry-0 base of this (slot, head)'s
    key, value, β and g rings.

    Each entry's loads are issued one entry ahead, so they overlap the previous entry's math instead of stalling
    the chain (the steps depend on each other through the tile, the loads do not). Session 26 also compiled the
    window as one triangular solve on the tensor cores (products S k̂_s and the keys' Gram matrix, forward
    substitution, the fold's product): 255 registers and spills on sm_90 at fp32-level (tf32x3) precision,
    against this loop's 80, so the loop stays until a GPU can time both."""
    entry = window_entry(rk_at, srk_l, srk_k, offs_k, mask_k, rv_at, srv_l, srv_v, offs_v, mask_v, rb_at, srb_l,
                         rg_at, srg_l, 0, count, now, k_now, v_now, beta_now, g_now)  # fmt: skip
    s = 0
    while s < count:  # a while loop: count lives on the device
        k, v, beta, g = entry
        entry = window_entry(rk_at, srk_l, srk_k, offs_k, mask_k, rv_at, srv_l, srv_v, offs_v, mask_v, rb_at, srb_l,
                             rg_at, srg_l, s + 1, count, now, k_now, v_now, beta_now, g_now)  # fmt: skip
        state = tl.exp(g) * state
        u = beta * (v - tl.sum(state * k[None, :], axis=1))
        state += u[:, None] * k[None, :]
        s += 1
    return state


def l2_normalise_reference(x: torch.Tensor) -> torch.Tensor:
    """PyTorch twin of ``l2_normalise`` along the last dimension."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def gdn_gates_reference(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch twin of ``gdn_gates`` for a, b [..., num_v_heads] and per-head A_log, dt_bias, computed in
    ``dtype`` (fp64 for the ground truth); β is rounded to b's dtype first, as in the kernel."""
    g = -torch.exp(A_log.to(dtype)) * softplus_reference(a.to(dtype) + dt_bias.to(dtype))
    beta = torch.sigmoid(b.to(dtype)).to(b.dtype).to(dtype)
    return g, beta


def replay_exact_reference(
    state: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    count: torch.Tensor,
) -> torch.Tensor:
    """PyTorch twin of ``replay_exact`` for rows: state [R, HV, V, K] advanced by entries [0, count) of keys
    [R, L, HV, K] (gathered per value head), values [R, L, HV, V], beta and g [R, L, HV], in state's dtype."""
    for s in range(int(count.max()) if count.numel() else 0):
        k = keys[:, s].to(state.dtype)
        advanced = torch.exp(g[:, s].to(state.dtype))[:, :, None, None] * state
        u = beta[:, s, :, None].to(state.dtype) * (values[:, s].to(state.dtype) - (advanced * k[:, :, None]).sum(-1))
        advanced = advanced + u[:, :, :, None] * k[:, :, None, :]
        state = torch.where((s < count)[:, None, None, None], advanced, state)
    return state


def fold_reference(
    state: torch.Tensor, weight: torch.Tensor, ring_u: torch.Tensor, ring_k: torch.Tensor
) -> torch.Tensor:
    """PyTorch twin of ``fold_into`` for rows: state [R, HV, V, K] + Σ_s weight [R, L, HV] · u [R, L, HV, V] k̂ᵀ
    (ring_k already gathered per value head, [R, L, HV, K])."""
    return state + torch.einsum("rlh,rlhv,rlhk->rhvk", weight, ring_u, ring_k)
