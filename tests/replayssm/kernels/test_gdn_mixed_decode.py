"""The one-launch GDN decode of mixed steps (conv inside) vs its PyTorch twin vs the fp64 recurrence, interpreted,
with the fp32 checkpoint and in split precision.

Tolerances as in test_gdn_kernels.py. The conv's output is rounded to the model dtype before the recurrence, so in
bf16 a last-ulp difference of the fp32 sum between NumPy and torch could flip a rounding and move an output by a
bf16 ulp: the bf16 case uses integer conv weights and states and no activation, whose sums are exact in any order.
"""

from __future__ import annotations

import math

import pytest
import torch

from replayssm_patch.kernels import decode_flush_len, gdn_mixed_decode, gdn_mixed_decode_reference
from replayssm_patch.kernels.gdn_ground_truth import gdn_recurrence_step
from replayssm_patch.kernels.gdn_layout import split_packed_qkv
from replayssm_patch.kernels.gdn_mixed_decode import causal_conv_update_reference
from tests.replayssm.kernels.numerics import rel_err, seeded
from tests.replayssm.kernels.test_gdn_kernels import (
    BF16_ULP,
    OUT_TOL,
    SPLIT_OUT_TOL,
    STATE_TOL,
    Shape,
    assert_same,
    fill_ring,
    make_cache,
    make_layer,
    make_step,
    ring_args,
    ring_fp64_state,
    window_fp64_state,
)

TWINS = [gdn_mixed_decode, gdn_mixed_decode_reference]
WIDTH = 4  # Qwen3.5's and Qwen3-Next's conv kernel
# head_v_dim 40: three 16-wide blocks, the last partial; two value heads per key head
FP32_SHAPE = Shape(2, 4, 16, 40, ring_len=4, batch=4, dtype=torch.float32)
BF16_SHAPE = Shape(1, 2, 16, 16, ring_len=8, batch=3, dtype=torch.bfloat16)


class Conv:
    """A layer's conv weights and the rows' conv states (state_len = width: the extra column must stay untouched)."""

    def __init__(self, shape: Shape, slots: int, gen: torch.Generator, exact: bool) -> None:
        self.dim = 2 * shape.num_k_heads * shape.head_k_dim + shape.num_v_heads * shape.head_v_dim
        self.dtype, self.exact = shape.dtype, exact
        self.weight = self.values((self.dim, WIDTH), gen)
        self.bias = None if exact else self.values((self.dim,), gen)
        self.state = self.values((slots, self.dim, WIDTH), gen)
        self.activation = None if exact else "silu"

    def values(self, size: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
        if self.exact:  # small integers: every product and sum exact in bf16 and fp32
            return torch.randint(-3, 4, size, generator=gen).to(self.dtype)
        return torch.randn(size, generator=gen).to(self.dtype)

    def args(self, state: torch.Tensor) -> tuple:
        return (state, self.weight, self.bias)


def mixed_args(x, conv: Conv, conv_state, step, layer, cache) -> tuple:
    return (x, *conv.args(conv_state), step.a, step.b, layer.A_log, layer.dt_bias, *ring_args(cache))


def truth_inputs(x: torch.Tensor, conv: Conv, conv_state: torch.Tensor, slots: torch.Tensor, shape: Shape):
    """The rows' q, k, v after the conv (PyTorch), shaped for the fp64 recurrence; advances conv_state."""
    qkv = causal_conv_update_reference(x, conv_state, conv.weight, conv.bias, slots, conv.activation)
    return split_packed_qkv(qkv, shape.num_k_heads, shape.head_k_dim, shape.num_v_heads, shape.head_v_dim)


@pytest.mark.parametrize("split", [False, True], ids=["fp32", "split"])
@pytest.mark.parametrize("shape", [FP32_SHAPE, BF16_SHAPE], ids=str)
def test_one_launch_tracks_fp64_across_flushes_and_shifts_the_conv_state(shape: Shape, split: bool) -> None:
    """4 L + 2 steps, cursors driven as the builder drives them, a padding row last: outputs and folded states
    against the fp64 recurrence on the same conv outputs, the conv states bit for bit against the twin's. In split
    precision (test_gdn_split_kernels' bars) outputs between flushes are within the copy's bound, flush rows' and
    the master after every flush on the fp64 trajectory, the copy one ulp from the master."""
    exact = shape.dtype == torch.bfloat16
    gen = seeded("gdn-mixed", shape, split)
    layer = make_layer(shape, gen)
    slots = shape.batch + 2
    indices = torch.cat([torch.randperm(slots, generator=gen)[: shape.batch - 1], torch.tensor([-1])]).to(torch.int32)
    real, rows = indices[:-1].long(), slice(0, shape.batch - 1)
    cache = make_cache(shape, slots, gen, split)
    conv = Conv(shape, slots, gen, exact)
    write_pos = torch.randint(0, shape.ring_len, (shape.batch,), generator=gen, dtype=torch.int32)
    write_pos[0] = shape.ring_len - 1
    fill_ring(shape, cache, real, write_pos[:-1], gen)
    truth_state = window_fp64_state if split else ring_fp64_state
    h = truth_state(cache, real, write_pos[:-1].long())
    runs = [(cache.clone(), conv.state.clone()) for _ in TWINS]
    truth_conv = conv.state.clone()
    folds = 0
    for t in range(4 * shape.ring_len + 2):
        step = make_step(shape, layer, gen)
        x = conv.values((shape.batch, conv.dim), gen)
        flush_len = decode_flush_len(write_pos, shape.ring_len)
        flush_len[-1] = shape.ring_len  # the padding row says flush
        outs = []
        for fn, (run, conv_state) in zip(TWINS, runs, strict=True):
            out = torch.full((shape.batch, shape.num_v_heads, shape.head_v_dim), 7.0)
            fn(*mixed_args(x, conv, conv_state, step, layer, run), indices, write_pos, flush_len, out=out,
               num_k_heads=shape.num_k_heads, head_k_dim=shape.head_k_dim, activation=conv.activation,
               split=run.split)  # fmt: skip
            outs.append(out)
        q, k, v = truth_inputs(x[rows], conv, truth_conv, real, shape)
        o_true = gdn_recurrence_step(h, q, k, v, step.a[rows], step.b[rows], layer.A_log, layer.dt_bias)
        folded = flush_len[:-1] > 0
        folds += int(folded.sum())
        for fn, out, (run, conv_state) in zip(TWINS, outs, runs, strict=True):
            assert rel_err(out[rows], o_true) <= (SPLIT_OUT_TOL if split else OUT_TOL), f"{fn.__name__} output {t}"
            assert (out[-1] == 7.0).all(), f"{fn.__name__} wrote the padding row's output, step {t}"
            if folded.any():
                assert rel_err(out[rows][folded], o_true[folded]) <= OUT_TOL, f"{fn.__name__} flush output {t}"
                assert rel_err(run.ssm_state[real[folded]], h[folded]) <= STATE_TOL, f"{fn.__name__} fold, step {t}"
                if run.split is not None:
                    copy = run.split.state_bf16[real[folded]].float()
                    assert rel_err(copy, run.ssm_state[real[folded]]) <= BF16_ULP, f"{fn.__name__} copy, step {t}"
            assert_same(conv_state, truth_conv, f"{fn.__name__} conv state, step {t}")
        write_pos = (write_pos + 1) % shape.ring_len

    assert folds >= 4 * (shape.batch - 1)
    assert_same(runs[0][1][..., WIDTH - 1], conv.state[..., WIDTH - 1], "the conv state's spare column changed")
    for run, _ in runs:
        assert rel_err(truth_state(run, real, write_pos[:-1].long()), h) <= STATE_TOL


@pytest.mark.parametrize("fn", TWINS, ids=lambda fn: fn.__name__)
def test_padding_and_off_ring_rows_touch_nothing(fn) -> None:
    """A padding row (vLLM's null block 0) and rows whose cursor is off the ring: no conv shift, no ring or state
    write, output left alone; the one real row next to them still runs."""
    shape = FP32_SHAPE
    gen = seeded("gdn-mixed-skip", fn.__name__)
    layer = make_layer(shape, gen)
    cache = make_cache(shape, 5, gen)
    cache.ssm_state[0] = math.nan
    conv = Conv(shape, 5, gen, exact=False)
    indices = torch.tensor([0, 2, 3, 4], dtype=torch.int32)
    write_pos = torch.tensor([0, shape.ring_len, -1, 0], dtype=torch.int32)
    flush_len = torch.full((4,), shape.ring_len, dtype=torch.int32)
    before, conv_before = cache.clone(), conv.state.clone()
    out = torch.full((4, shape.num_v_heads, shape.head_v_dim), 7.0)
    x = conv.values((4, conv.dim), gen)
    fn(*mixed_args(x, conv, conv.state, make_step(shape, layer, gen, batch=4), layer, cache), indices, write_pos,
       flush_len, out=out, num_k_heads=shape.num_k_heads, head_k_dim=shape.head_k_dim, pad_slot_id=0)  # fmt: skip
    assert (out[:3] == 7.0).all() and torch.isfinite(out[3]).all()
    skipped = [0, 2, 3]
    assert_same(conv.state[skipped], conv_before[skipped], "a skipped row's conv state shifted")
    assert not torch.equal(conv.state[4], conv_before[4]), "the real row's conv state did not shift"
    for name in ("ssm_state", "ring_k", "ring_u", "ring_g"):
        assert_same(getattr(cache, name)[skipped], getattr(before, name)[skipped], f"{name} of a skipped row")


def test_unknown_activation_is_refused() -> None:
    shape = FP32_SHAPE
    gen = seeded("gdn-mixed-activation")
    layer = make_layer(shape, gen)
    cache = make_cache(shape, 2, gen)
    conv = Conv(shape, 2, gen, exact=False)
    one = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="activation 'gelu'"):
        gdn_mixed_decode(*mixed_args(conv.values((1, conv.dim), gen), conv, conv.state, make_step(shape, layer, gen, 1),
                                     layer, cache), one, one, one, out=torch.empty(1, 4, 40), num_k_heads=2,
                         head_k_dim=16, activation="gelu")  # fmt: skip
