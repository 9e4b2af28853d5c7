"""Output-only replay decode: a coefficient launch and a 1-warp replay launch per layer and step, plus the fold.

1. ``_ring_coefficients_kernel``, one program per (batch row, B/C group), 2 warps: everything that depends
   on the row and group but not on head_dim, computed once instead of in every head_dim program (32x
   redundant before): bc[s] = B_s·C_t over the ring and the current B_t, and for the group's heads at once
   (a [heads, L] tile, not a serial loop over heads) the weights w[s] = exp(A·(dt summed after s))·dt_s and
   the checkpoint decay exp(A·Σdt). It appends B_t and dt_t to the ring (the only program that owns them).
2. ``_replay_step_kernel``, one program per (head_dim block, batch row, head), 1 warp, head_dim block
   fastest so a row's per-head inputs are fetched once: appends x_t, then
   y = Σ_s w_s·bc_s·x_s + decay·(h_c·C_t) + D·x_t, the checkpoint (fp32 master, or the bf16 copy in split
   precision) streamed in BLOCK_N-wide tiles, read once and never written.
3. On a decode step, rows whose window ends (flush_len > 0) skip 2. and are answered by the fold
   (``decode_fold``): a fixed grid of 4-warp programs over the compacted list of those rows, which writes
   h' = decay·h_c + Σ_s w_s·x_s⊗B_s to the fp32 master (and its bf16 copy) and y = h'·C_t + D·x_t.
Entries at ring positions > write_pos are never read (stale or non-finite values of a reused slot).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_patch.kernels.common import (
    block_size,
    check_launchable,
    decay_sum_after_reference,
    decay_sums_after,
    head_chunk,
    register_cap,
    softplus_f32,
    softplus_reference,
)
from replayssm_patch.kernels.decode_fold import FoldPlan, launch_decode_fold
from replayssm_patch.kernels.launch_config import launch_for
from replayssm_patch.kernels.layout import (
    PAD_SLOT_ID,
    group_of_head,
    per_head,
    per_head_dt,
    ring_entries,
    ring_len_of,
    valid_rows,
)

# The head_dim programs' launch shape comes from ``launch_config`` (default 1 warp, 16 head_dim rows, the
# checkpoint in 64-wide d_state tiles). vLLM's SSU runs 1-warp programs of 4 rows on the H200 (its tuned
# config); small programs keep registers low (the GPU runs many of them per SM) and need no cross-warp reductions.
COEF_NUM_WARPS = 2


# Activations are views at step-dependent offsets (eager mixed steps): never specialise on their alignment, or a
# new batch composition compiles a new kernel in the middle of serving (seen on the H200 as ~1.3 s stalls).
@triton.jit(do_not_specialize_on_alignment=["dt_ptr", "B_ptr", "C_ptr"])
def _ring_coefficients_kernel(
    dt_ptr, A_ptr, B_ptr, C_ptr, dt_bias_ptr, ring_B_ptr, ring_dt_ptr, slot_ptr, pos_ptr,
    bc_ptr, w_ptr, decay_ptr,
    d_state, ring_len, pad_slot_id,
    sdt_b, sdt_h, sB_b, sB_g, sB_n, sC_b, sC_g, sC_n,
    srB_slot, srB_g, srB_l, srB_n, srdt_slot, srdt_h, srdt_l,
    HEADS_PER_GROUP: tl.constexpr, HEAD_CHUNK: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    group = tl.program_id(1)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    if (slot == pad_slot_id) | (slot < 0) | (pos < 0) | (pos >= ring_len):  # padding, or a cursor off the ring
        return
    offs_l = tl.arange(0, BLOCK_L)
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = offs_n < d_state
    earlier = offs_l < pos
    live = offs_l <= pos

    C = tl.load(C_ptr + row * sC_b + group * sC_g + offs_n * sC_n, mask=mask_n, other=0.0).to(tl.float32)
    B_raw = tl.load(B_ptr + row * sB_b + group * sB_g + offs_n * sB_n, mask=mask_n, other=0.0)
    rB = ring_B_ptr + slot * srB_slot + group * srB_g
    ring_B = tl.load(
        rB + offs_l[:, None] * srB_l + offs_n[None, :] * srB_n, mask=earlier[:, None] & mask_n[None, :], other=0.0
    ).to(tl.float32)  # fmt: skip
    bc = tl.where(earlier, tl.sum(ring_B * C[None, :], axis=1), 0.0)
    bc = tl.where(offs_l == pos, tl.sum(B_raw.to(tl.float32) * C, axis=0), bc)

    # the heads' loads before any store (a load issued after a store waits for the store's data): with one chunk,
    # as every Nemotron-H group has, every load of the program
    heads = HEADS_PER_GROUP * tl.num_programs(1)
    for chunk in tl.static_range(HEADS_PER_GROUP // HEAD_CHUNK):  # one chunk unless a group has > 16 heads
        head = group * HEADS_PER_GROUP + chunk * HEAD_CHUNK + tl.arange(0, HEAD_CHUNK)
        dt = tl.load(dt_ptr + row * sdt_b + head * sdt_h).to(tl.float32)
        if HAS_DT_BIAS:
            dt += tl.load(dt_bias_ptr + head).to(tl.float32)
        if DT_SOFTPLUS:
            dt = softplus_f32(dt)
        A = tl.load(A_ptr + head).to(tl.float32)
        rdt = ring_dt_ptr + slot * srdt_slot + head * srdt_h  # [HEAD_CHUNK] pointers
        ring_dt = tl.load(rdt[:, None] + offs_l[None, :] * srdt_l, mask=earlier[None, :], other=0.0).to(tl.float32)
        all_dt = tl.where((offs_l == pos)[None, :], dt[:, None], ring_dt)  # [HEAD_CHUNK, L]
        weight = tl.where(live[None, :], tl.exp(A[:, None] * decay_sums_after(all_dt, offs_l)) * all_dt, 0.0)
        tl.store(w_ptr + (row * heads + head)[:, None] * BLOCK_L + offs_l[None, :], weight)
        tl.store(decay_ptr + row * heads + head, tl.exp(A * tl.sum(all_dt, axis=1)))
        tl.store(rdt + pos * srdt_l, dt.to(ring_dt_ptr.dtype.element_ty))
    tl.store(bc_ptr + (row * tl.num_programs(1) + group) * BLOCK_L + offs_l, bc)
    tl.store(rB + pos * srB_l + offs_n * srB_n, B_raw.to(ring_B_ptr.dtype.element_ty), mask=mask_n)


@triton.jit(do_not_specialize_on_alignment=["x_ptr", "C_ptr", "out_ptr"])
def _replay_step_kernel(
    x_ptr, C_ptr, D_ptr, read_ptr, ring_x_ptr,
    slot_ptr, pos_ptr, flush_ptr, bc_ptr, w_ptr, decay_ptr, out_ptr,
    head_dim, d_state, ring_len, nheads, heads_per_group, pad_slot_id,
    sx_b, sx_h, sx_p, sC_b, sC_g, sC_n, sr_slot, sr_h, sr_p, sr_n, srx_slot, srx_h, srx_l, srx_p, so_b, so_h, so_p,
    HAS_D: tl.constexpr, HAS_FLUSH: tl.constexpr,
    BLOCK_L: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, N_TILES: tl.constexpr,
):  # fmt: skip
    pblock = tl.program_id(0)
    row = tl.program_id(1)
    head = tl.program_id(2)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    skip = (slot == pad_slot_id) | (slot < 0) | (pos < 0) | (pos >= ring_len)
    if HAS_FLUSH:
        skip = skip | (tl.load(flush_ptr + row) > 0)  # the fold answers this row
    if skip:
        return
    group = head // heads_per_group
    offs_p = pblock * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_l = tl.arange(0, BLOCK_L)
    mask_p = offs_p < head_dim
    x_raw = tl.load(x_ptr + row * sx_b + head * sx_h + offs_p * sx_p, mask=mask_p, other=0.0)
    x = x_raw.to(tl.float32)
    rx = ring_x_ptr + slot * srx_slot + head * srx_h
    ring_x = tl.load(
        rx + offs_l[:, None] * srx_l + offs_p[None, :] * srx_p,
        mask=(offs_l < pos)[:, None] & mask_p[None, :], other=0.0,
    ).to(tl.float32)  # fmt: skip
    xs = tl.where((offs_l == pos)[:, None], x[None, :], ring_x)  # [L, P]: the ring with this step appended
    weight = tl.load(w_ptr + (row * nheads + head) * BLOCK_L + offs_l)
    bc = tl.load(bc_ptr + (row * (nheads // heads_per_group) + group) * BLOCK_L + offs_l)
    y = tl.sum((weight * bc)[:, None] * xs, axis=0)
    C_row = C_ptr + row * sC_b + group * sC_g
    read = tl.zeros((BLOCK_P,), dtype=tl.float32)
    for t in tl.static_range(N_TILES):
        offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < d_state
        h = tl.load(
            read_ptr + slot * sr_slot + head * sr_h + offs_p[:, None] * sr_p + offs_n[None, :] * sr_n,
            mask=mask_p[:, None] & mask_n[None, :], other=0.0, eviction_policy="evict_first",
        ).to(tl.float32)  # fmt: skip
        C = tl.load(C_row + offs_n * sC_n, mask=mask_n, other=0.0).to(tl.float32)
        read += tl.sum(h * C[None, :], axis=1)
    y += tl.load(decay_ptr + row * nheads + head) * read
    if HAS_D:
        y += tl.load(D_ptr + head).to(tl.float32) * x
    tl.store(out_ptr + row * so_b + head * so_h + offs_p * so_p, y.to(out_ptr.dtype.element_ty), mask=mask_p)
    # the ring's append last: a load issued after a store waits for the store's data (x's, one memory latency
    # before the checkpoint's loads could issue), as the verify's launches measured (session 20: 590 -> 446 µs)
    tl.store(rx + pos * srx_l + offs_p * srx_p, x_raw.to(ring_x_ptr.dtype.element_ty), mask=mask_p)


def _step_inputs(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    out: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """dt / A / D / dt_bias per head (whatever form vLLM hands them in) and the y buffer: both twins start here."""
    nheads = x.shape[1]
    out = torch.empty_like(x) if out is None else out
    return per_head_dt(dt), per_head(A, nheads), per_head(D, nheads), per_head(dt_bias, nheads), out


def launch_replay(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    read_state: torch.Tensor,
    ring_x: torch.Tensor,
    ring_B: torch.Tensor,
    ring_dt: torch.Tensor,
    state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    *,
    fold: FoldPlan | None,
    D: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    pad_slot_id: int,
    out: torch.Tensor | None,
    block_p: int | None,
    block_n: int | None,
    num_warps: int | None,
) -> torch.Tensor:
    """The launches of a replay (``fold`` None: replay only; else its rows fold into the master and answer)."""
    check_launchable(x, read_state)
    batch, nheads, head_dim = x.shape
    ngroups, d_state = B.shape[1], B.shape[2]
    dt, A, D, dt_bias, out = _step_inputs(x, dt, A, D, dt_bias, out)
    if batch == 0:
        return out
    ring_len = ring_len_of(ring_x)
    tuned = launch_for(read_state.dtype, x.device)
    BLOCK_L = block_size(ring_len, floor=16)
    BLOCK_P = block_size(head_dim, cap=block_p or tuned.block_p)
    BLOCK_N = block_size(d_state, cap=block_n or tuned.block_n)
    scratch = torch.empty(batch * (ngroups + nheads) * BLOCK_L + batch * nheads, dtype=torch.float32, device=x.device)
    bc = scratch[: batch * ngroups * BLOCK_L]
    weight = scratch[batch * ngroups * BLOCK_L : batch * (ngroups + nheads) * BLOCK_L]
    decay = scratch[batch * (ngroups + nheads) * BLOCK_L :]
    _ring_coefficients_kernel[(batch, ngroups)](
        dt, A, B, C, dt_bias if dt_bias is not None else A, ring_B, ring_dt, state_indices, write_pos,
        bc, weight, decay,
        d_state, ring_len, pad_slot_id,
        *dt.stride(), *B.stride(), *C.stride(), *ring_B.stride(), *ring_dt.stride(),
        HEADS_PER_GROUP=nheads // ngroups, HEAD_CHUNK=head_chunk(nheads // ngroups), HAS_DT_BIAS=dt_bias is not None,
        DT_SOFTPLUS=dt_softplus, BLOCK_L=BLOCK_L, BLOCK_N=block_size(d_state, floor=16), num_warps=COEF_NUM_WARPS,
    )  # fmt: skip
    _replay_step_kernel[(triton.cdiv(head_dim, BLOCK_P), batch, nheads)](
        x, C, D if D is not None else A, read_state, ring_x,
        state_indices, write_pos, fold.flush_len if fold is not None else write_pos, bc, weight, decay, out,
        head_dim, d_state, ring_len, nheads, nheads // ngroups, pad_slot_id,
        *x.stride(), *C.stride(), *read_state.stride(), *ring_x.stride(), *out.stride(),
        HAS_D=D is not None, HAS_FLUSH=fold is not None,
        BLOCK_L=BLOCK_L, BLOCK_P=BLOCK_P, BLOCK_N=BLOCK_N,
        N_TILES=triton.cdiv(d_state, BLOCK_N), num_warps=num_warps or tuned.num_warps, **register_cap(tuned.maxnreg),
    )  # fmt: skip
    if fold is not None:
        launch_decode_fold(fold, x, C, D, ring_x, ring_B, state_indices, write_pos, weight, decay, out, BLOCK_L)
    return out


def replay_decode(
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
    *,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = True,
    pad_slot_id: int = PAD_SLOT_ID,
    out: torch.Tensor | None = None,
    block_p: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Append the current step to the ring and return y [batch, nheads, head_dim] (z-gating not applied).

    x [batch, nheads, head_dim] post-conv; dt [batch, nheads] raw (or vLLM's [batch, nheads, head_dim]
    stride-0 expansion); A / D / dt_bias [nheads] (or vLLM's expanded forms); B, C [batch, ngroups, d_state];
    state [slots, nheads, head_dim, d_state] is the checkpoint to READ (the bf16 copy in split precision,
    else the master); ring tensors as in the package docstring; state_indices / write_pos int [batch].
    The checkpoint is never written. Padding rows (slot == pad_slot_id or < 0) are skipped and their
    ``out`` rows are left as they were; so are rows whose write_pos is off the ring (a metadata bug must not
    write into another slot). ``block_p`` / ``block_n`` (head_dim rows and d_state columns per tile) and
    ``num_warps`` are GPU tuning knobs only.
    """
    return launch_replay(
        x, dt, A, B, C, state, ring_x, ring_B, ring_dt, state_indices, write_pos,
        fold=None, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus,
        pad_slot_id=pad_slot_id, out=out, block_p=block_p, block_n=block_n, num_warps=num_warps,
    )  # fmt: skip


def replay_decode_reference(
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
    *,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = True,
    pad_slot_id: int = PAD_SLOT_ID,
    out: torch.Tensor | None = None,
    block_p: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Plain-PyTorch twin of ``replay_decode`` (same arguments; the tuning knobs are ignored), in fp32."""
    del block_p, block_n, num_warps
    nheads = x.shape[1]
    dt, A, D, dt_bias, out = _step_inputs(x, dt, A, D, dt_bias, out)
    ring_len = ring_len_of(ring_x)
    on_ring = (write_pos >= 0) & (write_pos < ring_len)
    rows = (valid_rows(state_indices, pad_slot_id) & on_ring).nonzero().squeeze(1)
    if rows.numel() == 0:
        return out
    entries_x, entries_B, entries_dt = ring_entries(ring_x), ring_entries(ring_B), ring_entries(ring_dt)
    slots, pos = state_indices[rows].long(), write_pos[rows].long()
    step_dt = dt[rows].float() + (dt_bias.float() if dt_bias is not None else 0.0)
    step_dt = softplus_reference(step_dt) if dt_softplus else step_dt
    entries_x[slots, pos] = x[rows].to(ring_x.dtype)
    entries_B[slots, pos] = B[rows].to(ring_B.dtype)
    entries_dt[slots, pos] = step_dt.to(ring_dt.dtype)

    live = torch.arange(ring_len, device=x.device)[None, :] <= pos[:, None]  # [R, L]
    all_dt = torch.where(live[:, :, None], entries_dt[slots].float(), 0.0)  # [R, L, H]
    all_x = torch.where(live[:, :, None, None], entries_x[slots].float(), 0.0)  # [R, L, H, P]
    heads_of_group = entries_B[slots].float()[:, :, group_of_head(nheads, B.shape[1], x.device)]  # [R, L, H, N]
    all_B = torch.where(live[:, :, None, None], heads_of_group, 0.0)
    C_heads = C[rows].float()[:, group_of_head(nheads, B.shape[1], x.device)]  # [R, H, N]
    decay = torch.where(live[:, :, None], torch.exp(A.float() * decay_sum_after_reference(all_dt, 1)), 0.0)
    coef = decay * all_dt * torch.einsum("rlhn,rhn->rlh", all_B, C_heads)
    y = torch.einsum("rlh,rlhp->rhp", coef, all_x)
    total = all_dt.sum(1)  # [R, H]
    y += torch.exp(A.float() * total)[:, :, None] * torch.einsum("rhpn,rhn->rhp", state[slots].float(), C_heads)
    if D is not None:
        y += D.float()[None, :, None] * x[rows].float()
    out[rows] = y.to(out.dtype)
    return out
