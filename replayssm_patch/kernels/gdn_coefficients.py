"""The first launch of a GDN decode step: everything that depends on the row and key head but not on head_v_dim.

Why a launch of its own: every value head of a key head, and every head_v_dim block of each, needs the same
normalised q̂ and k̂, the same ring-key products and (per value head) the same decay weights. Computed in each
of those programs, the [L, head_k_dim] ring of keys was re-read 8-16 times per key head (and, with the row
fastest in the grid, mostly from DRAM). One program per (row, key head) computes them once, into small
scratch tensors the replay and the fold read, with m = write_pos and G_s = g summed over the entries after s
up to and including this step (G_c: over all of them):
    q̂, k̂                                    normalised (q̂ scaled), [batch, num_k_heads, BLOCK_K]
    kk_s = k̂_s·k̂ (s < m),  kq_s = k̂_s·q̂ (s < m),  kq_m = k̂·q̂ (else 0)       [batch, num_k_heads, BLOCK_L]
    w_s = e^G_s (s <= m, else 0),  e^G_c,  β      per value head of the key head, [batch, num_v_heads, ...]
It appends k̂ and its value heads' g (and, in split precision, β) to the ring at m (the only program that owns
them); ring entries at or after m are never read, so a reused slot's stale (even non-finite) entries cannot leak.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from replayssm_patch.kernels.common import block_size, decay_sums_after, head_chunk
from replayssm_patch.kernels.gdn_common import gdn_gates, key_products, row_cursor

COEF_NUM_WARPS = 2


@triton.jit
def _gdn_coefficients_kernel(
    q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, ring_k_ptr, ring_g_ptr, ring_beta_ptr, slot_ptr, pos_ptr,
    qhat_ptr, khat_ptr, kk_ptr, kq_ptr, weight_ptr, decay_ptr, beta_ptr,
    scale, head_k_dim, ring_len, pad_slot_id,
    sq_b, sq_h, sq_k, sk_b, sk_h, sk_k, sa_b, sa_h, sb_b, sb_h, srk_slot, srk_l, srk_h, srk_k, srg_slot, srg_l, srg_h,
    srb_slot, srb_l, srb_h,
    V_PER_K: tl.constexpr, HEAD_CHUNK: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    khead = tl.program_id(1)
    slot, pos, skip = row_cursor(slot_ptr, pos_ptr, row, pad_slot_id, ring_len)
    if skip:
        return
    offs_k = tl.arange(0, BLOCK_K)
    offs_l = tl.arange(0, BLOCK_L)
    mask_k = offs_k < head_k_dim
    earlier = offs_l < pos
    now = offs_l == pos

    q = tl.load(q_ptr + row * sq_b + khead * sq_h + offs_k * sq_k, mask=mask_k, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + row * sk_b + khead * sk_h + offs_k * sk_k, mask=mask_k, other=0.0).to(tl.float32)
    rk_at = ring_k_ptr + slot * srk_slot + khead * srk_h
    q, k, kk, kq = key_products(q, k, scale, rk_at, srk_l, srk_k, offs_l, offs_k, mask_k, pos)

    # the value heads' loads before any store (a load issued after a store waits for the store's data): with one
    # chunk, as every Qwen3.5 key head has, every load of the program
    num_v_heads = V_PER_K * tl.num_programs(1)
    for chunk in tl.static_range(V_PER_K // HEAD_CHUNK):  # one chunk unless a key head has > 16 value heads
        head = khead * V_PER_K + chunk * HEAD_CHUNK + tl.arange(0, HEAD_CHUNK)
        g, beta = gdn_gates(
            tl.load(a_ptr + row * sa_b + head * sa_h), tl.load(b_ptr + row * sb_b + head * sb_h),
            tl.load(A_log_ptr + head).to(tl.float32), tl.load(dt_bias_ptr + head).to(tl.float32),
        )  # fmt: skip
        rg_at = ring_g_ptr + slot * srg_slot + head * srg_h  # [HEAD_CHUNK] pointers
        ring_g = tl.load(rg_at[:, None] + offs_l[None, :] * srg_l, mask=earlier[None, :], other=0.0)
        all_g = tl.where(now[None, :], g[:, None], ring_g)  # [HEAD_CHUNK, L]
        weight = tl.where((offs_l <= pos)[None, :], tl.exp(decay_sums_after(all_g, offs_l)), 0.0)
        per_head = row * num_v_heads + head
        tl.store(weight_ptr + per_head[:, None] * BLOCK_L + offs_l[None, :], weight)
        tl.store(decay_ptr + per_head, tl.exp(tl.sum(all_g, axis=1)))
        tl.store(beta_ptr + per_head, beta)
        tl.store(rg_at + pos * srg_l, g)
        if SPLIT:  # the exact replay of a split-precision flush needs β
            tl.store(ring_beta_ptr + slot * srb_slot + pos * srb_l + head * srb_h, beta)
    key = row * tl.num_programs(1) + khead
    tl.store(qhat_ptr + key * BLOCK_K + offs_k, q)
    tl.store(khat_ptr + key * BLOCK_K + offs_k, k)
    tl.store(kk_ptr + key * BLOCK_L + offs_l, kk)
    tl.store(kq_ptr + key * BLOCK_L + offs_l, kq)
    tl.store(rk_at + pos * srk_l + offs_k * srk_k, k, mask=mask_k)  # k̂ appended to the ring


@dataclass(frozen=True)
class GdnCoefficients:
    """The scratch the coefficient launch writes and the replay and fold launches read (fp32, rows padded to
    BLOCK_K / BLOCK_L entries; rows the launch skips hold garbage, and the other launches skip them too)."""

    key_query: torch.Tensor  # [2, batch * num_k_heads * BLOCK_K]: k̂, then q̂ (the replay reads both as one operand)
    kk: torch.Tensor  # [batch * num_k_heads * BLOCK_L]
    kq: torch.Tensor
    weight: torch.Tensor  # [batch * num_v_heads * BLOCK_L]
    decay: torch.Tensor  # [batch * num_v_heads]
    beta: torch.Tensor
    num_k_heads: int
    block_l: int
    block_k: int

    @classmethod
    def allocate(cls, batch: int, num_k_heads: int, num_v_heads: int, head_k_dim: int, ring_len: int,
                 device: torch.device) -> GdnCoefficients:  # fmt: skip
        """One buffer for all of it (a graph-safe allocation from the caching allocator)."""
        block_l, block_k = block_size(ring_len, floor=16), block_size(head_k_dim, floor=16)
        sizes = [2 * batch * num_k_heads * block_k] + [batch * num_k_heads * block_l] * 2
        sizes += [batch * num_v_heads * block_l, batch * num_v_heads, batch * num_v_heads]
        key_query, *parts = torch.empty(sum(sizes), dtype=torch.float32, device=device).split(sizes)
        return cls(key_query.view(2, -1), *parts, num_k_heads=num_k_heads, block_l=block_l, block_k=block_k)

    @property
    def k_hat(self) -> torch.Tensor:
        return self.key_query[0]

    @property
    def q_hat(self) -> torch.Tensor:
        return self.key_query[1]


def launch_gdn_coefficients(
    q: torch.Tensor,
    k: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ring_k: torch.Tensor,
    ring_g: torch.Tensor,
    state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    scale: float,
    pad_slot_id: int,
    num_v_heads: int,
    ring_beta: torch.Tensor | None = None,
) -> GdnCoefficients:
    """One program per (row, key head): write the scratch, append k̂ and g (and β to ``ring_beta``, split precision's
    [slots, L, num_v_heads] ring) at write_pos."""
    batch, num_k_heads, head_k_dim = q.shape
    ring_len = ring_g.shape[1]
    c = GdnCoefficients.allocate(batch, num_k_heads, num_v_heads, head_k_dim, ring_len, q.device)
    v_per_k = num_v_heads // num_k_heads
    split = ring_beta is not None
    ring_beta = ring_g if ring_beta is None else ring_beta  # never written without split precision
    _gdn_coefficients_kernel[(batch, num_k_heads)](
        q, k, a, b, A_log, dt_bias, ring_k, ring_g, ring_beta, state_indices, write_pos,
        c.q_hat, c.k_hat, c.kk, c.kq, c.weight, c.decay, c.beta,
        scale, head_k_dim, ring_len, pad_slot_id,
        *q.stride(), *k.stride(), *a.stride(), *b.stride(), *ring_k.stride(), *ring_g.stride(), *ring_beta.stride(),
        V_PER_K=v_per_k, HEAD_CHUNK=head_chunk(v_per_k), BLOCK_L=c.block_l, BLOCK_K=c.block_k, SPLIT=split,
        num_warps=COEF_NUM_WARPS,
    )  # fmt: skip
    return c
