"""Output-only replay decode: append this step's x/B/dt to the ring and answer y from checkpoint + ring.

One program per (batch row, head, head_dim block). It READS the checkpoint (fp32 master or bf16 copy) and
the ring entries before write_pos, WRITES only the ring entry at write_pos and y. The append lives in this
kernel (not a separate one) because the program already holds x, B and dt in registers; other heads of a
group read ring_B only at positions < write_pos, so the group leader's B store at write_pos cannot race.
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
    softplus_f32,
    softplus_reference,
)
from replayssm_patch.kernels.layout import PAD_SLOT_ID, group_of_head, per_head, per_head_dt, valid_rows


@triton.jit
def _replay_decode_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dt_bias_ptr,
    state_ptr, ring_x_ptr, ring_B_ptr, ring_dt_ptr, slot_ptr, pos_ptr, out_ptr,
    head_dim, d_state, ring_len, heads_per_group, pad_slot_id,
    sx_b, sx_h, sx_p, sdt_b, sdt_h, sB_b, sB_g, sB_n, sC_b, sC_g, sC_n,
    ss_slot, ss_h, ss_p, ss_n,
    srx_slot, srx_l, srx_h, srx_p, srB_slot, srB_l, srB_g, srB_n, srdt_slot, srdt_l, srdt_h,
    so_b, so_h, so_p,
    HAS_D: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    BLOCK_L: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    head = tl.program_id(1)
    pblock = tl.program_id(2)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    if (slot == pad_slot_id) | (slot < 0) | (pos < 0) | (pos >= ring_len):  # padding, or a cursor off the ring
        return
    group = head // heads_per_group
    offs_p = pblock * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    offs_l = tl.arange(0, BLOCK_L)
    mask_p = offs_p < head_dim
    mask_n = offs_n < d_state
    # The checkpoint tile is the one big read: issue it first so its latency hides behind the ring math.
    h = tl.load(
        state_ptr + slot * ss_slot + head * ss_h + offs_p[:, None] * ss_p + offs_n[None, :] * ss_n,
        mask=mask_p[:, None] & mask_n[None, :], other=0.0,
    ).to(tl.float32)  # fmt: skip

    x_raw = tl.load(x_ptr + row * sx_b + head * sx_h + offs_p * sx_p, mask=mask_p, other=0.0)
    x = x_raw.to(tl.float32)
    dt = tl.load(dt_ptr + row * sdt_b + head * sdt_h).to(tl.float32)
    if HAS_DT_BIAS:
        dt += tl.load(dt_bias_ptr + head).to(tl.float32)
    if DT_SOFTPLUS:
        dt = softplus_f32(dt)
    A = tl.load(A_ptr + head).to(tl.float32)
    B_raw = tl.load(B_ptr + row * sB_b + group * sB_g + offs_n * sB_n, mask=mask_n, other=0.0)
    C = tl.load(C_ptr + row * sC_b + group * sC_g + offs_n * sC_n, mask=mask_n, other=0.0).to(tl.float32)

    # Append the current step at write_pos (dt and B once per head / group, x per head_dim block).
    rx_slot = ring_x_ptr + slot * srx_slot + head * srx_h
    rB_slot = ring_B_ptr + slot * srB_slot + group * srB_g
    rdt_slot = ring_dt_ptr + slot * srdt_slot + head * srdt_h
    tl.store(rx_slot + pos * srx_l + offs_p * srx_p, x_raw.to(ring_x_ptr.dtype.element_ty), mask=mask_p)
    first_block = pblock == 0
    tl.store(rdt_slot + pos * srdt_l, dt.to(ring_dt_ptr.dtype.element_ty), mask=first_block)
    group_leader = first_block & (head % heads_per_group == 0)
    tl.store(rB_slot + pos * srB_l + offs_n * srB_n, B_raw.to(ring_B_ptr.dtype.element_ty), mask=mask_n & group_leader)

    # Earlier ring entries (positions < write_pos); masked loads never touch stale or non-finite rows.
    earlier = offs_l < pos
    ring_dt = tl.load(rdt_slot + offs_l * srdt_l, mask=earlier, other=0.0).to(tl.float32)
    all_dt = tl.where(offs_l == pos, dt, ring_dt)
    total = tl.sum(all_dt, axis=0)
    decay = tl.where(earlier, tl.exp(A * decay_sum_after(all_dt, offs_l)), 0.0)
    ring_B = tl.load(
        rB_slot + offs_l[:, None] * srB_l + offs_n[None, :] * srB_n,
        mask=earlier[:, None] & mask_n[None, :], other=0.0,
    ).to(tl.float32)  # fmt: skip
    coef = decay * ring_dt * tl.sum(ring_B * C[None, :], axis=1)
    ring_x = tl.load(
        rx_slot + offs_l[:, None] * srx_l + offs_p[None, :] * srx_p,
        mask=earlier[:, None] & mask_p[None, :], other=0.0,
    ).to(tl.float32)  # fmt: skip
    y = tl.sum(coef[:, None] * ring_x, axis=0) + dt * tl.sum(B_raw.to(tl.float32) * C, axis=0) * x

    y += tl.exp(A * total) * tl.sum(h * C[None, :], axis=1)
    if HAS_D:
        y += tl.load(D_ptr + head).to(tl.float32) * x
    tl.store(out_ptr + row * so_b + head * so_h + offs_p * so_p, y.to(out_ptr.dtype.element_ty), mask=mask_p)


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


def default_replay_block_p(state_dtype: torch.dtype) -> int:
    """head_dim rows per program: the fastest of the H200 sweep at Nemotron-H-8B shapes, batch 256
    (replayssm_patch/gpu/results/kernel_bench-h200.md: fp32 checkpoint 32 -> 342 us, 16 -> 438 us; bf16 copy
    64 -> 226 us, 16 -> 439 us). The narrower bf16 rows want more of them per program."""
    return 64 if state_dtype.itemsize <= 2 else 32


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
    num_warps: int = 4,
) -> torch.Tensor:
    """Append the current step to the ring and return y [batch, nheads, head_dim] (z-gating not applied).

    x [batch, nheads, head_dim] post-conv; dt [batch, nheads] raw (or vLLM's [batch, nheads, head_dim]
    stride-0 expansion); A / D / dt_bias [nheads] (or vLLM's expanded forms); B, C [batch, ngroups, d_state];
    state [slots, nheads, head_dim, d_state] is the checkpoint to READ (the bf16 copy in split precision,
    else the master); ring tensors as in the package docstring; state_indices / write_pos int [batch].
    The checkpoint is never written. Padding rows (slot == pad_slot_id or < 0) are skipped and their
    ``out`` rows are left as they were; so are rows whose write_pos is off the ring (a metadata bug must not
    write into another slot). ``block_p`` (head_dim rows per program, default ``default_replay_block_p``)
    and ``num_warps`` are GPU tuning knobs only.
    """
    check_launchable(x, state)
    batch, nheads, head_dim = x.shape
    ngroups, d_state = B.shape[1], B.shape[2]
    dt, A, D, dt_bias, out = _step_inputs(x, dt, A, D, dt_bias, out)
    if batch == 0:
        return out
    BLOCK_P = block_size(head_dim, cap=block_p or default_replay_block_p(state.dtype))
    grid = (batch, nheads, triton.cdiv(head_dim, BLOCK_P))
    _replay_decode_kernel[grid](
        x, dt, A, B, C, D if D is not None else A, dt_bias if dt_bias is not None else A,
        state, ring_x, ring_B, ring_dt, state_indices, write_pos, out,
        head_dim, d_state, ring_x.shape[1], nheads // ngroups, pad_slot_id,
        *x.stride(), *dt.stride(), *B.stride(), *C.stride(), *state.stride(),
        *ring_x.stride(), *ring_B.stride(), *ring_dt.stride(), *out.stride(),
        HAS_D=D is not None, HAS_DT_BIAS=dt_bias is not None, DT_SOFTPLUS=dt_softplus,
        BLOCK_L=block_size(ring_x.shape[1]), BLOCK_P=BLOCK_P, BLOCK_N=block_size(d_state),
        num_warps=num_warps,
    )  # fmt: skip
    return out


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
    num_warps: int = 4,
) -> torch.Tensor:
    """Plain-PyTorch twin of ``replay_decode`` (same arguments; block_p / num_warps are ignored), in fp32."""
    del block_p, num_warps
    nheads = x.shape[1]
    dt, A, D, dt_bias, out = _step_inputs(x, dt, A, D, dt_bias, out)
    on_ring = (write_pos >= 0) & (write_pos < ring_x.shape[1])
    rows = (valid_rows(state_indices, pad_slot_id) & on_ring).nonzero().squeeze(1)
    if rows.numel() == 0:
        return out
    slots, pos = state_indices[rows].long(), write_pos[rows].long()
    step_dt = dt[rows].float() + (dt_bias.float() if dt_bias is not None else 0.0)
    step_dt = softplus_reference(step_dt) if dt_softplus else step_dt
    ring_x[slots, pos] = x[rows].to(ring_x.dtype)
    ring_B[slots, pos] = B[rows].to(ring_B.dtype)
    ring_dt[slots, pos] = step_dt.to(ring_dt.dtype)

    ring_len = ring_x.shape[1]
    live = torch.arange(ring_len, device=x.device)[None, :] <= pos[:, None]  # [R, L]
    all_dt = torch.where(live[:, :, None], ring_dt[slots].float(), 0.0)  # [R, L, H]
    all_x = torch.where(live[:, :, None, None], ring_x[slots].float(), 0.0)  # [R, L, H, P]
    heads_of_group = ring_B[slots].float()[:, :, group_of_head(nheads, B.shape[1], x.device)]  # [R, L, H, N]
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
