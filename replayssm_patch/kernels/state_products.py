"""A checkpoint tile times a few vectors on the tensor cores: the reads of the Mamba-2 verify and the GDN replay.

Both read a state tile [rows, cols] (cols contiguous) once and need its products with a handful of vectors (the
verify's T query tokens' C; the GDN replay's k̂ and q̂). On the CUDA cores each product is a sum across lanes per
row; here the vectors are the columns of one [cols, 16] operand and the products one pipelined tl.dot per column
tile (``checkpoint_reads_mma``), at fp32-level error (``fp32_dot``).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from replayssm_patch.kernels.interpreter_dot import bf16_dots_by_value

if os.environ.get("TRITON_INTERPRET") == "1":  # the bf16 products below, by value on the CPU too
    bf16_dots_by_value()

# tl.dot's least extent: the tensor-core form's tiles and its vector columns are at least this
DOT_EXTENT = 16


@triton.jit
def checkpoint_tile(state_at, offs_p, offs_n, sr_p, sr_n, mask_p, d_state, EVEN: tl.constexpr):
    """A tile of a checkpoint in its own dtype (offsets and mask_p broadcast to its shape; ``d_state`` the columns
    there are), read to be dropped from L2 soon: it is read once a step and never written here. Unmasked when the
    blocks divide the rows and columns (``EVEN``): a masked load zeroes its registers first, one instruction per two
    (the Mamba-2 verify, session 21)."""
    at = state_at + offs_p * sr_p + offs_n * sr_n
    if EVEN:
        return tl.load(at, eviction_policy="evict_first")
    return tl.load(at, mask=mask_p & (offs_n < d_state), other=0.0, eviction_policy="evict_first")


@triton.jit
def tf32_head(v):
    """v's tf32 part (its 10 leading mantissa bits): v - head is exact, and so is each in tf32."""
    return (v.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def fp32_dot(a, b, acc, A_IN_TF32: tl.constexpr, B_IN_TF32: tl.constexpr):
    """a @ b + acc (fp32 operands) on the tensor cores at fp32-level error: one tf32 pass where both are exact in tf32
    (``*_IN_TF32``: they came in 16 bits), two where one is (the other's tf32 head and its remainder, ~2^-21
    relative; ptxas: 1,312 instructions per warp for the verify's checkpoint reads against ~2,030 for tf32x3, which
    splits both), else tf32x3."""
    if A_IN_TF32 and B_IN_TF32:
        acc = tl.dot(a, b, acc, input_precision="tf32")
    elif B_IN_TF32:
        head = tf32_head(a)
        acc = tl.dot(head, b, acc, input_precision="tf32")
        acc = tl.dot(a - head, b, acc, input_precision="tf32")
    elif A_IN_TF32:
        head = tf32_head(b)
        acc = tl.dot(a, head, acc, input_precision="tf32")
        acc = tl.dot(a, b - head, acc, input_precision="tf32")
    else:
        acc = tl.dot(a, b, acc, input_precision="tf32x3")
    return acc


@triton.jit
def checkpoint_reads_mma(
    state_at, C_at, sC_t, sC_n, c_count, sr_p, sr_n, mask_p, d_state,
    TILE_T: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, N_TILES: tl.constexpr,
    EVEN: tl.constexpr, STAGES: tl.constexpr, C_IN_TF32: tl.constexpr, C_IN_BF16: tl.constexpr,
    desc=None, desc_at=None, TMA: tl.constexpr = False,
):  # fmt: skip
    """A checkpoint tile's products with up to TILE_T vectors, transposed: [BLOCK_P, TILE_T] (the vectors padded to
    tl.dot's 16, 0 past ``c_count``), checkpoint [P, N] x C^T [N, TILE_T] per column tile (``fp32_dot``: one tf32
    pass where both are exact in tf32, as the bf16 split copy and C from bf16 are). C_at: the first vector, vector j
    at C_at + j·sC_t, its columns sC_n apart (the verify's tokens' C; the GDN replay's k̂ and q̂). Where both are
    bf16 (``C_IN_BF16``: the vectors came from bf16, and a bf16 tile, the split copy), the products are bf16 MMAs
    (m16n8k16, exact products summed in fp32, as the one tf32 pass is, with half its MMAs).
    The tiles run in a ``tl.range`` loop, so Triton's pipeliner copies them to shared memory ``STAGES`` deep and the
    MMAs read them there: session 20's form (static tiles through registers) lost; this one won session 23's sweep
    (the verify step at batch 256 505.2 against 548.0 µs on the CUDA cores, T = 8 499.7 against 688.3 without folds).
    ``TMA``: the tiles come through ``desc`` (a tensor descriptor of the checkpoint, [slots, heads, rows, cols]) at
    ``desc_at`` = (slot, head, first row), as Hopper's tensor memory accelerator copies them
    (``checkpoint_tile_product``)."""
    read_T = tl.zeros((BLOCK_P, TILE_T), dtype=tl.float32)
    for t in tl.range(0, N_TILES, num_stages=STAGES):
        read_T = checkpoint_tile_product(state_at, C_at, sC_t, sC_n, c_count, sr_p, sr_n, mask_p, d_state, t, read_T,
                                         TILE_T, BLOCK_P, BLOCK_N, EVEN, C_IN_TF32, C_IN_BF16, desc, desc_at,
                                         TMA)  # fmt: skip
    return read_T


@triton.jit
def checkpoint_tile_product(
    state_at, C_at, sC_t, sC_n, c_count, sr_p, sr_n, mask_p, d_state, t, read_T,
    TILE_T: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr, C_IN_TF32: tl.constexpr,
    C_IN_BF16: tl.constexpr, desc=None, desc_at=None, TMA: tl.constexpr = False,
):  # fmt: skip
    """``read_T`` plus d_state tile ``t``'s share of ``checkpoint_reads_mma``'s products: one loop step, so a loop
    that walks several heads' tiles (the Mamba-2 verify's ``heads_per_program``) pipelines the same body. With
    ``TMA`` the tile is a tensor-memory-accelerator copy through ``desc`` (rows and columns past the checkpoint's
    read as 0), so no address arithmetic per element holds registers: the pipelined loop's copies go straight to
    shared memory."""
    offs_p = tl.arange(0, BLOCK_P)
    offs_t = tl.arange(0, TILE_T)
    offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
    if TMA:
        slot, head, first_row = desc_at
        h = desc.load([slot, head, first_row, t * BLOCK_N]).reshape(BLOCK_P, BLOCK_N)
    else:
        h = checkpoint_tile(state_at, offs_p[:, None], offs_n[None, :], sr_p, sr_n, mask_p[:, None], d_state, EVEN)
    live = (offs_t < c_count)[None, :]
    if not EVEN:  # the fp32 copy is 0 past d_state; the model's C ends there
        live = live & (offs_n < d_state)[:, None]
    C_T = tl.load(C_at + offs_t[None, :] * sC_t + offs_n[:, None] * sC_n, mask=live, other=0.0)
    if C_IN_BF16 and h.dtype == tl.bfloat16:  # both exact in bf16: its products, half the tf32 pass's MMAs
        read_T = tl.dot(h, C_T.to(tl.bfloat16), read_T)
    else:
        h32, C32 = h.to(tl.float32), C_T.to(tl.float32)
        read_T = fp32_dot(h32, C32, read_T, h.dtype == tl.bfloat16, C_IN_TF32 or h.dtype == tl.bfloat16)
    return read_T
