"""GDN split precision (Triton under TRITON_INTERPRET=1, its PyTorch twin, the fp64 recurrence): the replay reads a
bf16 copy of the checkpoint, a flush replays the window exactly on the fp32 master.

Inputs, stale NaN ring entries and ``rel_err`` as in ``test_gdn_kernels``. Tolerances and why:
- The master after every flush vs the fp64 recurrence: STATE_TOL (1e-6), as without split precision. The flush
  replays the window's steps from the raw (k̂, v, β, g) in fp32, in vLLM's order, so the copy's rounding never
  reaches it (observed <= 4e-7 across 4 flushes).
- A flush row's output: OUT_TOL (1e-5); it is read from the new master.
- Any other row's output: SPLIT_OUT_TOL = 2^-6 of the output's scale. The copy is one bf16 ulp off the master
  per element (2^-7 in the interpreter, which truncates; 2^-8 on the GPU, which rounds); that reaches o directly
  through S_c q̂ and again through every u of the window (β < 1 and unit keys keep each share below S_c k̂'s), so
  two ulps bound it; observed <= 4.2e-3. A missed ring entry or a wrong decay gives O(1e-1).
- The copy after a flush vs the master: one bf16 ulp (BF16_ULP).
The one-launch kernel of a mixed step's decode rows, the materialise fold and L = 1 (the baseline step) are held to
the same bars in test_gdn_mixed_decode and test_gdn_kernels (their split cases).
"""

from __future__ import annotations

import math

import pytest
import torch

from replayssm_patch.kernels import (
    GdnReplayCache,
    decode_flush_len,
)
from replayssm_patch.kernels.gdn_common import gdn_gates_reference
from tests.replayssm.kernels.numerics import layout_rows, rel_err, seeded
from tests.replayssm.kernels.test_gdn_kernels import (
    BF16_ULP,
    FLUSH_TWINS,
    OUT_TOL,
    SHAPES,
    SPLIT_OUT_TOL,
    STATE_TOL,
    STEP_CASES,
    STEP_TWINS,
    Shape,
    assert_same,
    cache_tensors,
    fill_ring,
    fp32_out,
    make_cache,
    make_layer,
    make_step,
    ring_args,
    step_args,
    truth_step,
    window_fp64_state,
)


def split_step(fn, step, layer, run: GdnReplayCache, *args, **kwargs) -> torch.Tensor:
    return fn(*step_args(step, layer, run), *args, split=run.split, **kwargs)


@pytest.mark.parametrize("shape", STEP_CASES[1:], ids=str)
def test_split_steps_keep_the_master_on_the_fp64_trajectory(shape: Shape) -> None:
    """4 L + 2 steps, the cursor driven as the builder drives it (row 0 flushes first, the others at random
    cursors): every flush leaves the fp32 master where the fp64 recurrence is and refreshes the copy; outputs
    between flushes are within the copy's bound, flush rows' within the fp32 one."""
    gen = seeded("gdn-split-steps", shape)
    layer = make_layer(shape, gen)
    indices, slots = layout_rows(shape.batch, gen, -1)
    real, rows = indices[:-1].long(), slice(0, shape.batch - 1)
    cache = make_cache(shape, slots, gen, split=True)
    write_pos = torch.randint(0, shape.ring_len, (shape.batch,), generator=gen, dtype=torch.int32)
    write_pos[0] = shape.ring_len - 1
    if shape.batch > 2:  # a row that answers from a window it did not write: the u the replay kept from the copy
        write_pos[1] = (shape.ring_len - 1) // 2
    fill_ring(shape, cache, real, write_pos[:-1], gen)
    h = window_fp64_state(cache, real, write_pos[:-1].long())
    runs = [cache.clone() for _ in STEP_TWINS]
    flushes = 0
    for t in range(4 * shape.ring_len + 2):
        step = make_step(shape, layer, gen)
        flush_len = decode_flush_len(write_pos, shape.ring_len)
        outs = [split_step(fn, step, layer, run, indices, write_pos, flush_len, **fp32_out(shape))
                for fn, run in zip(STEP_TWINS, runs, strict=True)]  # fmt: skip
        o_true = truth_step(h, step, layer, rows)
        folded = flush_len[:-1] > 0
        flushes += int(folded[0])
        for fn, out, run in zip(STEP_TWINS, outs, runs, strict=True):
            assert run.split is not None
            assert rel_err(out[rows], o_true) <= SPLIT_OUT_TOL, f"{fn.__name__} output, step {t}"
            if folded.any():
                assert rel_err(out[rows][folded], o_true[folded]) <= OUT_TOL, f"{fn.__name__} flush output {t}"
                assert rel_err(run.ssm_state[real[folded]], h[folded]) <= STATE_TOL, f"{fn.__name__} fold, step {t}"
                copy = run.split.state_bf16[real[folded]].float()
                assert rel_err(copy, run.ssm_state[real[folded]]) <= BF16_ULP, f"{fn.__name__} copy, step {t}"
        write_pos = (write_pos + 1) % shape.ring_len
    assert flushes >= 4

    for run in runs:
        assert rel_err(window_fp64_state(run, real, write_pos[:-1].long()), h) <= STATE_TOL


@pytest.mark.parametrize("pad_slot_id", [-1, 0], ids=["pad-1", "nullblock0"])
def test_split_step_appends_beta_and_v_and_touches_nothing_else(pad_slot_id: int) -> None:
    """One step with a full ring (flush), an empty one and a random one, plus a padding row that says flush: a
    non-flush row appends (k̂, u, g, β, v) at write_pos; a flush row rewrites its master and copy; nothing else
    changes, and the padding row's output is left alone."""
    shape = SHAPES[1]
    gen = seeded("gdn-split-step", pad_slot_id)
    layer = make_layer(shape, gen)
    indices, slots = layout_rows(shape.batch, gen, pad_slot_id)
    cache = make_cache(shape, slots, gen, split=True)
    real = indices[:-1].long()
    write_pos = torch.tensor([shape.ring_len - 1, 0, 3], dtype=torch.int32)
    fill_ring(shape, cache, real, write_pos[:-1], gen)
    flush_len = decode_flush_len(write_pos, shape.ring_len)
    flush_len[-1] = shape.ring_len
    step = make_step(shape, layer, gen)
    runs = [cache.clone() for _ in STEP_TWINS]
    sentinel = torch.full((shape.batch, shape.num_v_heads, shape.head_v_dim), 7.0)
    outs = [split_step(fn, step, layer, run, indices, write_pos, flush_len, pad_slot_id=pad_slot_id,
                       out=sentinel.clone()) for fn, run in zip(STEP_TWINS, runs, strict=True)]  # fmt: skip

    _, beta = gdn_gates_reference(step.a, step.b, layer.A_log, layer.dt_bias)
    appending = real[1:], write_pos[1:-1].long()  # the non-flush rows' slots and positions
    flushing = real[:1]
    for out, run in zip(outs, runs, strict=True):
        assert (out[-1] == 7.0).all(), "the padding row's output must be left alone"
        now, then = ({name: t.clone() for name, t in cache_tensors(c).items()} for c in (run, cache))
        torch.testing.assert_close(now["ring_beta"][appending], beta[1:-1], rtol=1e-6, atol=0)
        assert torch.equal(now["ring_v"][appending], step.v[1:-1]), "raw v, exactly"
        for name in ("ssm_state", "state_bf16"):
            assert not torch.equal(now[name][flushing], then[name][flushing]), f"the flush row's {name}"
            now[name][flushing] = then[name][flushing]
        for name in ("ring_k", "ring_u", "ring_g", "ring_beta", "ring_v"):
            # a flush row's entries at write_pos are the next window's to overwrite: no claim on them
            now[name][flushing, write_pos[0].long()] = then[name][flushing, write_pos[0].long()]
            now[name][appending] = then[name][appending]
        for name in now:
            assert_same(now[name], then[name], f"{name} changed outside the appended entries and the flush row")
    for name in ("ring_u", "ring_v"):
        ours, twin = (cache_tensors(run)[name][appending].float() for run in runs[:2])
        assert rel_err(ours, twin) <= OUT_TOL, name


def test_split_null_rows_read_and_write_nothing() -> None:
    """Padding rows with any cursor and flush flag, in split precision: vLLM's null block (slot 0) holds NaN in
    every tensor, and none of it may reach a real row or be written."""
    shape = SHAPES[1]
    gen = seeded("gdn-split-null")
    layer = make_layer(shape, gen)
    cache = make_cache(shape, 4, gen, split=True)
    assert cache.split is not None
    for tensor in cache_tensors(cache).values():
        tensor[0] = math.nan
    fill_ring(shape, cache, torch.tensor([1, 3]), torch.tensor([2, shape.ring_len - 1]), gen)
    indices = torch.tensor([1, 0, 3, 0], dtype=torch.int32)
    write_pos = torch.tensor([2, shape.ring_len - 1, shape.ring_len - 1, 0], dtype=torch.int32)
    flush_len = torch.tensor([0, shape.ring_len, shape.ring_len, shape.ring_len], dtype=torch.int32)
    for step_fn, flush_fn in zip(STEP_TWINS[:2], FLUSH_TWINS, strict=True):
        run = cache.clone()
        out = torch.full((4, shape.num_v_heads, shape.head_v_dim), 7.0)
        split_step(step_fn, make_step(shape, layer, gen, batch=4), layer, run, indices, write_pos, flush_len,
                   out=out, pad_slot_id=0)  # fmt: skip
        flush_fn(*ring_args(run), indices, flush_len, pad_slot_id=0, split=run.split)
        assert (out[[1, 3]] == 7.0).all() and torch.isfinite(out[[0, 2]]).all(), step_fn.__name__
        for name, tensor in cache_tensors(run).items():
            assert_same(tensor[[0, 2]], cache_tensors(cache)[name][[0, 2]], f"{step_fn.__name__}: {name} of a null row")
