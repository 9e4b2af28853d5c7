"""ReplaySSM kernels (Triton, under TRITON_INTERPRET=1) vs their PyTorch references vs the fp64 recurrence.

Inputs use realistic decay: A = -exp(U[0, log 16]) and dt = softplus(U[-5, 0]) (raw dt = U[-5, 0] - dt_bias),
x, B, C, D and checkpoints standard normal. Errors are measured relative to the largest |value| of the
compared tensor (``rel_err``), so a tolerance reads as "fraction of the output's scale".

Tolerances and why:
- Triton vs PyTorch reference, and fp32 checkpoint vs fp64 truth: 2e-5. Both paths compute in fp32; the
  largest sums are d_state-long dot products and ring-long sums (<= 32 terms), whose rounding error is a
  few ulp (fp32 ulp ~ 6e-8) times the term count; the decays are formed from directly summed dt (no
  cumsum cancellation), so the exponent error stays ~1e-7 relative. 2e-5 leaves ~10x headroom over the
  ~1e-6 we observe and still catches any wrong decay, missed entry or group mix-up (those give O(1e-1)).
- Split precision (replay reads the bf16 checkpoint copy): bounded element by element by the bf16
  rounding of the checkpoint, one bf16 ulp = 2^-7 relative per element, so
  |err| <= 2^-7 * exp(A*S) * sum_n |h_n C_n| plus the fp32 slack above. A full ulp, not half: Triton's
  interpreter truncates fp32 -> bf16 (on the GPU it rounds to nearest even, 2^-8). Triton and reference
  read the same bf16 copy, so they agree to 2e-5 there too.
- Flush keeps the fp32 master exact to fp32 in both modes (bf16 error never compounds): 2e-5 vs fp64;
  the bf16 copy it writes is within one bf16 ulp (2^-7) of the master.
Outputs are requested in fp32 (``out=``) even for bf16 models, so a bf16 rounding of y cannot hide errors.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

import pytest
import torch

from replayssm_patch.cursors import first_window_end
from replayssm_patch.kernels import (
    PAD_SLOT_ID,
    ReplayCache,
    copy_state_to_bf16,
    decode_flush_len,
    flush_ring,
    flush_ring_reference,
    replay_decode,
    replay_decode_reference,
    replay_decode_step,
    replay_decode_step_reference,
    ring_shapes,
)
from replayssm_patch.kernels.common import softplus_reference
from replayssm_patch.kernels.cursor_plan import plan_decode_rows, plan_decode_rows_reference
from replayssm_patch.kernels.decode_fold import flush_work_list
from replayssm_patch.kernels.ground_truth import recurrence_step_fp64
from replayssm_patch.kernels.layout import group_of_head, ring_len_of
from replayssm_patch.kernels.layout import ring_entries as entries
from replayssm_patch.kernels.synthetic import LayerParams, StepInputs
from tests.replayssm.kernels.numerics import layout_rows, rel_err, seeded

FP32_TOL = 2e-5
BF16_ULP = 2.0**-7


@dataclass(frozen=True)
class Shape:
    nheads: int
    head_dim: int
    d_state: int
    ngroups: int
    ring_len: int
    batch: int
    dtype: torch.dtype  # model dtype of x / B / C and of the ring's x and B

    def __str__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return f"H{self.nheads}P{self.head_dim}N{self.d_state}G{self.ngroups}L{self.ring_len}b{self.batch}{dtype}"


SHAPES = [
    Shape(nheads=2, head_dim=4, d_state=8, ngroups=1, ring_len=4, batch=3, dtype=torch.float32),
    Shape(nheads=4, head_dim=16, d_state=16, ngroups=2, ring_len=16, batch=3, dtype=torch.bfloat16),
    Shape(nheads=6, head_dim=5, d_state=12, ngroups=3, ring_len=5, batch=3, dtype=torch.float32),
    Shape(nheads=3, head_dim=24, d_state=32, ngroups=3, ring_len=8, batch=2, dtype=torch.bfloat16),
]


def make_layer(shape: Shape, gen: torch.Generator) -> LayerParams:
    return LayerParams.random(shape.nheads, gen)


def make_step(shape: Shape, layer: LayerParams, gen: torch.Generator) -> StepInputs:
    return StepInputs.random(
        shape.batch, shape.nheads, shape.head_dim, shape.ngroups, shape.d_state, layer, gen, shape.dtype
    )


def make_cache(shape: Shape, slots: int, split: bool, gen: torch.Generator) -> ReplayCache:
    """Random checkpoints; every ring entry NaN (stale garbage from a previous sequence) until filled."""
    spec = ring_shapes(shape.nheads, shape.head_dim, shape.ngroups, shape.d_state, shape.ring_len, split)
    cache = ReplayCache.allocate(slots, spec, model_dtype=shape.dtype, ring_fill=math.nan)
    cache.set_checkpoint(torch.arange(slots), torch.randn(cache.ssm_state.shape, generator=gen))
    return cache


def fill_ring(shape: Shape, cache: ReplayCache, slots: torch.Tensor, count: torch.Tensor, gen: torch.Generator) -> None:
    """Give each slot `count` valid ring entries (positions 0..count-1) with realistic dt."""
    for slot, n in zip(slots.tolist(), count.tolist(), strict=True):
        entries(cache.ring_x)[slot, :n] = torch.randn(n, shape.nheads, shape.head_dim, generator=gen).to(shape.dtype)
        entries(cache.ring_B)[slot, :n] = torch.randn(n, shape.ngroups, shape.d_state, generator=gen).to(shape.dtype)
        entries(cache.ring_dt)[slot, :n] = softplus_reference(torch.rand(n, shape.nheads, generator=gen) * 5.0 - 5.0)


def ring_fp64_state(cache: ReplayCache, slots: torch.Tensor, count: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """fp64 truth of the state after the checkpoint absorbed ring entries [0, count): step by step."""
    h = cache.ssm_state[slots].double()
    ring_x, ring_B, ring_dt = entries(cache.ring_x), entries(cache.ring_B), entries(cache.ring_dt)
    for pos in range(ring_len_of(cache.ring_x)):
        advanced = h.clone()
        active = pos < count
        if not active.any():
            break
        at = torch.where(active, pos, 0)
        recurrence_step_fp64(
            advanced, ring_x[slots, at], ring_dt[slots, at], A, ring_B[slots, at], ring_B[slots, at],
            dt_softplus=False,
        )  # fmt: skip
        h = torch.where(active[:, None, None, None], advanced, h)
    return h


def step_args(step: StepInputs, layer: LayerParams, cache: ReplayCache, read_state: torch.Tensor | None = None):
    """The leading positional arguments of replay_decode and replay_decode_step (same order in both)."""
    state = cache.ssm_state if read_state is None else read_state
    return (step.x, step.dt, layer.A, step.B, step.C, state, cache.ring_x, cache.ring_B, cache.ring_dt)


def truth_step(h: torch.Tensor, step: StepInputs, layer: LayerParams, rows: slice) -> torch.Tensor:
    """One fp64 baseline step for the real rows (advances h)."""
    step = step.rows(rows)
    return recurrence_step_fp64(h, step.x, step.dt, layer.A, step.B, step.C, D=layer.D, dt_bias=layer.dt_bias)


def split_bound(cache: ReplayCache, slots: torch.Tensor, C: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """Per-element bound of what reading the bf16 checkpoint copy can change in y: 2^-7 * decay * sum|h C|."""
    C_heads = C.double()[:, group_of_head(cache.ssm_state.shape[1], C.shape[1], C.device)]
    mass = torch.einsum("rhpn,rhn->rhp", cache.ssm_state[slots].double().abs(), C_heads.abs())
    return BF16_ULP * decay[:, :, None] * mass


@pytest.mark.parametrize("split", [False, True], ids=["fp32", "split"])
@pytest.mark.parametrize("pad_slot_id", [-1, 0], ids=["pad-1", "nullblock0"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_replay_decode_matches_reference_and_fp64(shape: Shape, pad_slot_id: int, split: bool) -> None:
    gen = seeded(shape, pad_slot_id, split)
    layer = make_layer(shape, gen)
    indices, slots = layout_rows(shape.batch, gen, pad_slot_id)
    cache = make_cache(shape, slots, split, gen)
    real = indices[:-1].long()
    write_pos = torch.randint(0, shape.ring_len, (shape.batch,), generator=gen, dtype=torch.int32)
    write_pos[0] = shape.ring_len - 1  # a full ring (flush step) and, below, an empty one
    if shape.batch > 2:
        write_pos[1] = 0
    fill_ring(shape, cache, real, write_pos[:-1], gen)
    step = make_step(shape, layer, gen)
    kw = {"D": layer.D, "dt_bias": layer.dt_bias, "pad_slot_id": pad_slot_id}
    rows = slice(0, shape.batch - 1)
    sentinel = torch.full((shape.batch, shape.nheads, shape.head_dim), 7.0)

    outs, caches = [], []
    for fn in (replay_decode, replay_decode_reference):
        run = cache.clone()
        args = step_args(step, layer, run, run.state_bf16 if split else None)
        outs.append(fn(*args, indices, write_pos, out=sentinel.clone(), **kw))
        caches.append(run)
    (y_tri, y_ref), (c_tri, c_ref) = outs, caches

    # Truth: checkpoint absorbs the ring, then one baseline step in fp64.
    h = ring_fp64_state(cache, real, write_pos[:-1].long(), layer.A)
    y_true = truth_step(h, step, layer, rows)
    assert torch.isfinite(y_tri[rows].float()).all()
    assert rel_err(y_tri[rows], y_ref[rows]) <= FP32_TOL
    if split:
        dt_now = softplus_reference(step.dt[rows] + layer.dt_bias)
        decay = decay_to_now(cache, real, write_pos[:-1].long(), dt_now, layer.A)
        bound = split_bound(cache, real, step.C[rows], decay) + FP32_TOL * y_true.abs().max()
        assert ((y_tri[rows].double() - y_true).abs() <= bound).all()
    else:
        assert rel_err(y_tri[rows], y_true) <= FP32_TOL
    assert (y_tri[-1] == 7.0).all() and (y_ref[-1] == 7.0).all(), "padding row's output must be left alone"

    # Writes: exactly the ring entry at write_pos of real slots; checkpoint and everything else untouched.
    for run in (c_tri, c_ref):
        expected = cache.clone()
        entries(expected.ring_x)[real, write_pos[:-1].long()] = step.x[rows]
        entries(expected.ring_B)[real, write_pos[:-1].long()] = step.B[rows]
        assert torch.equal(run.ssm_state, cache.ssm_state)
        assert torch.equal(run.ring_x.nan_to_num(), expected.ring_x.nan_to_num())
        assert torch.equal(run.ring_B.nan_to_num(), expected.ring_B.nan_to_num())
        assert torch.equal(run.ring_dt.isnan(), cache.ring_dt.isnan() & ~_written(cache, real, write_pos[:-1]))
    # softplus as log(exp(dt) + 1) (vLLM's formula, kept for bit-compatibility with the baseline) rounds 1 + e^dt,
    # an absolute error of ~6e-8, i.e. up to ~1e-5 relative for the smallest dt (softplus(-5) = 0.0067).
    torch.testing.assert_close(c_tri.ring_dt.nan_to_num(), c_ref.ring_dt.nan_to_num(), rtol=2e-5, atol=0)
    expected_dt = softplus_reference(step.dt[rows] + layer.dt_bias)
    torch.testing.assert_close(entries(c_tri.ring_dt)[real, write_pos[:-1].long()], expected_dt, rtol=2e-5, atol=0)


def _written(cache: ReplayCache, slots: torch.Tensor, write_pos: torch.Tensor) -> torch.Tensor:
    mask = torch.zeros(cache.ring_dt.shape, dtype=torch.bool)
    entries(mask)[slots, write_pos.long()] = True
    return mask


@pytest.mark.parametrize(
    ("prefetch", "listed", "block_n"),
    [(False, False, None), (True, False, None), (True, True, None), (False, True, None), (True, True, 16),
     (False, False, 16)],
    ids=["in-order", "prefetch", "prefetch, listed rows", "in-order, listed rows", "prefetch, listed, d_state by 16",
         "in-order, d_state by 16"],
)  # fmt: skip
@pytest.mark.parametrize("split", [False, True], ids=["fp32", "split"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_flush_matches_reference_and_fp64(
    shape: Shape, split: bool, prefetch: bool, listed: bool, block_n: int | None
) -> None:
    """Both orders of the launch's head_dim blocks (head_dim 24: two blocks of 16, the second one partly masked):
    in order or the next block's loads first; each with a program per row or a fixed grid walking the list of
    folding rows (as the verify's fold runs); and the work items cut into d_state blocks of 16 (d_state 32: two),
    the 1-2-warp programs' form."""
    gen = seeded(shape, split, "flush")
    layer = make_layer(shape, gen)
    indices, slots = layout_rows(shape.batch, gen, -1)
    cache = make_cache(shape, slots, split, gen)
    real = indices[:-1].long()
    # Full ring (decode flush), a partial one (materialise before prefill), and a row that must not flush;
    # entries past flush_len stay NaN (stale), which must not reach the checkpoint.
    flush_len = torch.randint(1, shape.ring_len + 1, (shape.batch,), generator=gen, dtype=torch.int32)
    flush_len[0] = shape.ring_len
    if shape.batch > 2:
        flush_len[1] = 0
    flush_len[-1] = shape.ring_len  # padding row: skipped whatever its length
    fill_ring(shape, cache, real, flush_len[:-1], gen)

    work_list = None
    if listed:
        work_list = flush_work_list(flush_len, indices, torch.zeros_like(flush_len), shape.ring_len, PAD_SLOT_ID)
    results = []
    for fn in (flush_ring, flush_ring_reference):
        run = cache.clone()
        fn(run.ssm_state, run.ring_x, run.ring_B, run.ring_dt, layer.A, indices, flush_len, state_bf16=run.state_bf16,
           prefetch=prefetch, work_list=work_list, block_n=block_n)  # fmt: skip
        results.append(run)
    c_tri, c_ref = results

    truth = ring_fp64_state(cache, real, flush_len[:-1].long(), layer.A)
    assert rel_err(c_tri.ssm_state[real], c_ref.ssm_state[real]) <= FP32_TOL
    assert rel_err(c_tri.ssm_state[real], truth) <= FP32_TOL
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[real[flush_len[:-1] > 0]] = False
    for run in (c_tri, c_ref):
        assert torch.equal(run.ssm_state[untouched], cache.ssm_state[untouched])
        assert torch.equal(run.ring_x.nan_to_num(), cache.ring_x.nan_to_num()), "flush must not touch the ring"
        if split:
            assert torch.equal(run.state_bf16[untouched], cache.state_bf16[untouched])
            assert rel_err(run.state_bf16[~untouched], run.ssm_state[~untouched]) <= BF16_ULP


def decay_to_now(
    cache: ReplayCache, slots: torch.Tensor, write_pos: torch.Tensor, dt_now: torch.Tensor, A: torch.Tensor
):
    """exp(A * S_w): decay from the checkpoint to the current step (ring entries before write_pos + this dt)."""
    earlier = torch.arange(ring_len_of(cache.ring_x))[None, :, None] < write_pos[:, None, None]
    summed = torch.where(earlier, entries(cache.ring_dt)[slots].double(), 0.0).sum(1) + dt_now.double()
    return torch.exp(A.double() * summed)


@pytest.mark.parametrize("split", [False, True], ids=["fp32", "split"])
@pytest.mark.parametrize("shape", SHAPES[:3], ids=str)
def test_decode_steps_track_fp64_recurrence_across_flushes(shape: Shape, split: bool) -> None:
    """Rows start at different cursors and run L+3 steps, so every row crosses a flush boundary and row 0
    (starting at L-2) crosses two; the cursor is driven the way the metadata builder drives it: flush
    (flush_len = L) when write_pos == L-1, then restart at 0. In split precision Triton and reference may
    differ by their bf16 roundings of the copy (see module docstring), so each is held to the bound."""
    gen = seeded(shape, split, "steps")
    layer = make_layer(shape, gen)
    indices, slots = layout_rows(shape.batch, gen, -1)
    real = indices[:-1].long()
    rows = slice(0, shape.batch - 1)
    cache = make_cache(shape, slots, split, gen)
    write_pos = torch.randint(0, shape.ring_len, (shape.batch,), generator=gen, dtype=torch.int32)
    write_pos[0] = shape.ring_len - 2
    fill_ring(shape, cache, real, write_pos[:-1], gen)
    h = ring_fp64_state(cache, real, write_pos[:-1].long(), layer.A)
    tri, ref = cache.clone(), cache.clone()
    kw = {"D": layer.D, "dt_bias": layer.dt_bias}
    out_shape = (shape.batch, shape.nheads, shape.head_dim)
    for t in range(shape.ring_len + 3):
        step = make_step(shape, layer, gen)
        flush_len = decode_flush_len(write_pos, shape.ring_len)
        dt_now = softplus_reference(step.dt[rows] + layer.dt_bias)
        decay = decay_to_now(tri, real, write_pos[:-1].long(), dt_now, layer.A)
        bound = split_bound(tri, real, step.C[rows], decay) if split else 0.0
        outs = []
        for fn, run in ((replay_decode_step, tri), (replay_decode_step_reference, ref)):
            args = (*step_args(step, layer, run), indices, write_pos, flush_len)
            outs.append(fn(*args, state_bf16=run.state_bf16, out=torch.empty(out_shape), **kw)[rows])
        y_true = truth_step(h, step, layer, rows)
        if not split:
            assert rel_err(outs[0], outs[1]) <= FP32_TOL, f"step {t}"
        for y in outs:
            assert ((y.double() - y_true).abs() <= bound + FP32_TOL * y_true.abs().max()).all(), f"step {t}"
        write_pos = (write_pos + 1) % shape.ring_len

    # The master checkpoint stays fp32-exact in both modes (bf16 error never compounds across flushes).
    h_master = ring_fp64_state(tri, real, write_pos[:-1].long(), layer.A)
    assert rel_err(h_master, h) <= FP32_TOL
    if split:
        assert rel_err(tri.state_bf16[real], tri.ssm_state[real]) <= BF16_ULP


def test_vllm_expanded_arguments_give_the_same_output() -> None:
    """vLLM's mixer hands A as [H, P, N], dt / D / dt_bias expanded over head_dim (stride 0): accepted as is."""
    shape = SHAPES[1]
    gen = torch.Generator().manual_seed(5)
    layer = make_layer(shape, gen)
    indices, slots = layout_rows(shape.batch, gen, -1)
    cache = make_cache(shape, slots, False, gen)
    write_pos = torch.zeros(shape.batch, dtype=torch.int32)
    step = make_step(shape, layer, gen)
    P, N = shape.head_dim, shape.d_state
    plain = replay_decode(*step_args(step, layer, cache), indices, write_pos, D=layer.D, dt_bias=layer.dt_bias)
    expanded = replay_decode(
        step.x, step.dt[:, :, None].expand(-1, -1, P), layer.A[:, None, None].expand(-1, P, N),
        step.B, step.C, cache.ssm_state, cache.ring_x, cache.ring_B, cache.ring_dt, indices, write_pos,
        D=layer.D[:, None].expand(-1, P), dt_bias=layer.dt_bias[:, None].expand(-1, P),
    )  # fmt: skip
    rows = slice(0, shape.batch - 1)
    assert torch.equal(plain[rows], expanded[rows])


def test_strided_views_into_one_page_buffer() -> None:
    """Cache tensors may be non-contiguous views (vLLM pages); the kernels honour every stride."""
    shape = SHAPES[2]
    gen = torch.Generator().manual_seed(9)
    layer = make_layer(shape, gen)
    indices, slots = layout_rows(shape.batch, gen, -1)
    dense = make_cache(shape, slots, False, gen)
    real = indices[:-1].long()
    fill_ring(shape, dense, real, torch.full((len(real),), shape.ring_len - 1), gen)
    page = torch.full((slots, 3, *dense.ssm_state.shape[1:]), math.nan)  # slot stride 3x the state
    page[:, 1] = dense.ssm_state
    strided = ReplayCache(page[:, 1], dense.ring_x.clone(), dense.ring_B.clone(), dense.ring_dt.clone(), None)
    step = make_step(shape, layer, gen)
    x_strided = torch.randn(shape.batch, shape.nheads, 2 * shape.head_dim, generator=gen)[:, :, ::2]
    x_strided.copy_(step.x)
    write_pos = torch.full((shape.batch,), shape.ring_len - 1, dtype=torch.int32)
    flush_len = torch.full((shape.batch,), shape.ring_len, dtype=torch.int32)
    outs = []
    for cache, x in ((dense, step.x), (strided, x_strided)):
        args = step_args(dataclasses.replace(step, x=x), layer, cache)
        outs.append(replay_decode_step(*args, indices, write_pos, flush_len, D=layer.D, dt_bias=layer.dt_bias))
    rows = slice(0, shape.batch - 1)
    assert torch.equal(outs[0][rows], outs[1][rows])
    assert torch.equal(dense.ssm_state[real], strided.ssm_state[real])
    assert page[:, 0].isnan().all() and page[:, 2].isnan().all(), "bytes outside the view must stay untouched"


@pytest.mark.parametrize("pair", [(replay_decode, flush_ring), (replay_decode_reference, flush_ring_reference)])
def test_bad_cursors_never_write_outside_the_row(pair) -> None:
    """A write_pos off the ring skips the row (no write into a neighbour slot); flush_len > L folds L."""
    replay, flush = pair
    shape = SHAPES[0]
    gen = seeded("bad-cursors")
    layer = make_layer(shape, gen)
    indices, slots = layout_rows(shape.batch, gen, -1)
    cache = make_cache(shape, slots, False, gen)
    fill_ring(shape, cache, indices[:-1].long(), torch.full((shape.batch - 1,), shape.ring_len), gen)
    before = cache.clone()
    out = torch.full((shape.batch, shape.nheads, shape.head_dim), 7.0)
    off_ring = torch.tensor([shape.ring_len, -1, 0], dtype=torch.int32)
    replay(*step_args(make_step(shape, layer, gen), layer, cache), indices, off_ring, out=out)
    assert (out == 7.0).all()
    for now, then in ((cache.ring_x, before.ring_x), (cache.ring_B, before.ring_B), (cache.ring_dt, before.ring_dt)):
        torch.testing.assert_close(now, then, rtol=0, atol=0, equal_nan=True)

    over, exact = cache.clone(), cache.clone()
    for run, length in ((over, shape.ring_len + 5), (exact, shape.ring_len)):
        flush_len = torch.full((shape.batch,), length, dtype=torch.int32)
        flush(run.ssm_state, run.ring_x, run.ring_B, run.ring_dt, layer.A, indices, flush_len)
    assert torch.equal(over.ssm_state, exact.ssm_state)


def test_copy_state_to_bf16_refreshes_real_slots_only() -> None:
    master = torch.randn(5, 2, 3, 4)
    copy = torch.zeros(5, 2, 3, 4, dtype=torch.bfloat16)
    copy_state_to_bf16(master, copy, torch.tensor([3, -1, 1], dtype=torch.int32))
    assert torch.equal(copy[[1, 3]], master[[1, 3]].to(torch.bfloat16))
    assert (copy[[0, 2, 4]] == 0).all()


def test_copy_state_to_bf16_without_pads_copies_every_row() -> None:
    master = torch.randn(5, 2, 3, 4)
    copy = torch.zeros(5, 2, 3, 4, dtype=torch.bfloat16)
    copy_state_to_bf16(master, copy, torch.tensor([0, 4], dtype=torch.int32), pad_slot_id=None)
    assert torch.equal(copy[[0, 4]], master[[0, 4]].to(torch.bfloat16))
    assert (copy[[1, 2, 3]] == 0).all()


def test_ring_shapes_and_bytes() -> None:
    spec = ring_shapes(nheads=128, head_dim=64, ngroups=8, d_state=128, buffer_len=16, split_precision=True)
    assert spec.ring_x == (128, 16, 64) and spec.ring_B == (8, 16, 128) and spec.ring_dt == (128, 16)
    assert spec.state_bf16 == (128, 64, 128)
    assert spec.nbytes(torch.bfloat16) == 16 * 128 * 64 * 2 + 16 * 8 * 128 * 2 + 16 * 128 * 4 + 128 * 64 * 128 * 2
    assert ring_shapes(4, 8, 2, 16, 4, split_precision=False).state_bf16 is None
    with pytest.raises(ValueError, match="multiple of ngroups"):
        ring_shapes(nheads=6, head_dim=8, ngroups=4, d_state=16, buffer_len=4, split_precision=False)


def test_cpu_tensors_need_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    shape = SHAPES[0]
    gen = torch.Generator().manual_seed(1)
    layer = make_layer(shape, gen)
    cache = make_cache(shape, 4, False, gen)
    step = make_step(shape, layer, gen)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert os.environ["TRITON_INTERPRET"] == "0"
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        zeros = torch.zeros(shape.batch, dtype=torch.int32)
        replay_decode(*step_args(step, layer, cache), zeros, zeros)


def test_cursor_plan_kernel_matches_its_reference_over_many_steps() -> None:
    """The one-launch plan (interpreted) and its PyTorch twin drive the same cursors, staggered windows, null
    block rows and graph padding included, across 3 windows."""
    L, blocks = 4, 12
    slots = torch.tensor([5, 0, 9, 2, 7, 0, 0, 0], dtype=torch.int32)  # rows 5..7: padding past real_rows
    tables = []
    for plan in (plan_decode_rows, plan_decode_rows_reference):
        positions = torch.zeros(blocks, dtype=torch.int32)
        window_end = first_window_end(torch.arange(blocks), L, stagger=True)
        seen = []
        for _ in range(3 * L):
            write_pos = torch.full((8,), -7, dtype=torch.int32)
            flush_len = torch.full((8,), -7, dtype=torch.int32)
            flush_rows, flush_count = torch.full((8,), -7, dtype=torch.int32), torch.full((1,), -7, dtype=torch.int32)
            plan(slots, positions, window_end, write_pos, flush_len, 5, L, 0, flush_rows, flush_count)
            listed = flush_rows[: int(flush_count)].tolist()
            assert listed == (flush_len > 0).nonzero().squeeze(1).tolist(), "the fold's list: flush rows, in order"
            assert (flush_rows[int(flush_count) :] == -7).all(), "entries past the count are left alone"
            seen.append((write_pos.tolist(), flush_len.tolist()))
        tables.append((seen, positions.tolist(), window_end.tolist()))
    assert tables[0] == tables[1]
    seen = tables[0][0]
    assert [w[1] for w, _ in seen] == [0] * (3 * L) and [w[5:] for w, _ in seen] == [[0, 0, 0]] * (3 * L)
    assert [f[0] for _, f in seen][:L] == [0, 0, 3, 0]  # slot 5: first window ends at L-1 - 1


@pytest.mark.parametrize("split", [False, True], ids=["fp32", "split"])
def test_decode_step_folds_exactly_the_listed_rows(split: bool) -> None:
    """The fold walks the cursor plan's list, not flush_len: given the plan's list (stale entries past the count),
    the step equals the one that derives the list itself, bit for bit, and its PyTorch twin; rows flushing are
    answered by the fold (y = h'·C + D·x), every other row by the replay, and only flush rows' masters change.
    In split precision the twin answers flush rows from the bf16 copy, the fold from the fp32 master: only
    the other rows' outputs are compared there."""
    shape = dataclasses.replace(SHAPES[1], batch=6)
    gen = seeded(shape, split, "listed-fold")
    layer = make_layer(shape, gen)
    indices, slots = layout_rows(shape.batch, gen, -1)
    real = indices[:-1].long()
    write_pos = torch.randint(0, shape.ring_len, (shape.batch,), generator=gen, dtype=torch.int32)
    write_pos[:2], write_pos[2:4] = shape.ring_len - 1, 0  # both kinds of row, whatever the draw
    cache = make_cache(shape, slots, split, gen)
    fill_ring(shape, cache, real, write_pos[:-1], gen)
    flush_len = decode_flush_len(write_pos, shape.ring_len)
    flushing = (flush_len[:-1] > 0).nonzero().squeeze(1)
    flush_rows = torch.full((shape.batch,), shape.batch + 99, dtype=torch.int32)  # stale past the count
    flush_rows[: flushing.numel()] = flushing.to(torch.int32)
    flush_count = torch.tensor([flushing.numel()], dtype=torch.int32)
    step = make_step(shape, layer, gen)
    runs = {"listed": cache.clone(), "derived": cache.clone(), "reference": cache.clone()}
    outs = {}
    for name, run in runs.items():
        fn = replay_decode_step_reference if name == "reference" else replay_decode_step
        listing = {"flush_rows": flush_rows, "flush_count": flush_count} if name == "listed" else {}
        out = torch.full((shape.batch, shape.nheads, shape.head_dim), 7.0)
        args = (*step_args(step, layer, run), indices, write_pos, flush_len)
        outs[name] = fn(*args, state_bf16=run.state_bf16, out=out, D=layer.D, dt_bias=layer.dt_bias, **listing)
    assert torch.equal(outs["listed"], outs["derived"])
    assert torch.equal(runs["listed"].ssm_state, runs["derived"].ssm_state)
    compared = (flush_len[:-1] == 0).nonzero().squeeze(1) if split else torch.arange(shape.batch - 1)
    assert rel_err(outs["listed"][compared], outs["reference"][compared]) <= FP32_TOL
    assert (outs["listed"][-1] == 7.0).all(), "the padding row is left as it was"
    changed = (runs["listed"].ssm_state != cache.ssm_state).flatten(1).any(1)
    folded_slots = set(real[flushing].tolist())
    assert {int(i) for i in changed.nonzero().squeeze(1)} == folded_slots
    assert rel_err(runs["listed"].ssm_state[real], runs["reference"].ssm_state[real]) <= FP32_TOL
    if split:
        assert rel_err(runs["listed"].state_bf16[real], runs["listed"].ssm_state[real]) <= BF16_ULP
