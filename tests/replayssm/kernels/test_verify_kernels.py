"""Speculative verify (Triton under TRITON_INTERPRET=1, and its PyTorch twin) vs the fp64 Mamba-2 recurrence.

The multi-step tests drive the rows with the real cursor table (``CursorTable.verify_step``, what the metadata
builder calls): each step commits the accepted prefix of the row's last verify, folds a history that would
overflow the ring and appends T tokens. The fp64 truth keeps, per row, the state after its accepted tokens only;
every output of a verify (accepted or not) must equal the recurrence run from that committed state. Tolerances as
in test_replay_kernels.py (fp32 paths 2e-5 of the output scale; split precision bounded by one bf16 ulp of the
checkpoint copy, summed over d_state, decayed to the token).
"""

from __future__ import annotations

import pytest
import torch

from replayssm_patch.cursors import NULL_BLOCK_ID, CursorTable
from replayssm_patch.kernels import flush_ring_reference
from replayssm_patch.kernels.common import softplus_reference
from replayssm_patch.kernels.cursor_plan import plan_verify_rows, plan_verify_rows_reference
from replayssm_patch.kernels.ground_truth import recurrence_step_fp64
from replayssm_patch.kernels.layout import group_of_head
from replayssm_patch.kernels.layout import ring_entries as entries
from replayssm_patch.kernels.synthetic import StepInputs
from replayssm_patch.kernels.verify import (
    checkpoint_descriptor,
    replay_verify,
    replay_verify_reference,
    replay_verify_step,
    replay_verify_step_reference,
)
from tests.replayssm.kernels.numerics import rel_err, seeded
from tests.replayssm.kernels.test_replay_kernels import (
    BF16_ULP,
    FP32_TOL,
    Shape,
    fill_ring,
    make_cache,
    make_layer,
    ring_fp64_state,
)

VERIFY_SHAPES = [
    (Shape(nheads=2, head_dim=4, d_state=8, ngroups=1, ring_len=4 + 3, batch=3, dtype=torch.float32), 3),
    (Shape(nheads=4, head_dim=16, d_state=16, ngroups=2, ring_len=6 + 4, batch=3, dtype=torch.bfloat16), 4),
    (Shape(nheads=6, head_dim=5, d_state=12, ngroups=3, ring_len=5 + 2, batch=4, dtype=torch.float32), 2),
    # 8 heads in one group: the coefficient launch's head tiles (VERIFY_HEAD_CHUNK = 4) take two passes
    (Shape(nheads=8, head_dim=4, d_state=8, ngroups=1, ring_len=4 + 4, batch=2, dtype=torch.float32), 4),
]


def tokens(shape: Shape, layer, count: int, gen: torch.Generator) -> StepInputs:
    return StepInputs.random(count, shape.nheads, shape.head_dim, shape.ngroups, shape.d_state, layer, gen, shape.dtype)


def truth_outputs(h: torch.Tensor, step: StepInputs, layer, first: int, count: int) -> tuple[torch.Tensor, list]:
    """fp64 outputs of ``count`` recurrence steps from state h [1, H, P, N] (not modified), and the state after each."""
    h = h.clone()
    ys, states = [], []
    for t in range(first, first + count):
        one = step.rows(slice(t, t + 1))
        ys.append(recurrence_step_fp64(h, one.x, one.dt, layer.A, one.B, one.C, D=layer.D, dt_bias=layer.dt_bias))
        states.append(h.clone())
    return torch.cat(ys), states


def verify_bound(cache, slot: int, C: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """Split precision: 2^-7 * decay_j * sum_n |h_n C_jn| per output element of one row's tokens ([T, H, P])."""
    C_heads = C.double()[:, group_of_head(cache.ssm_state.shape[1], C.shape[1], C.device)]
    mass = torch.einsum("hpn,thn->thp", cache.ssm_state[slot].double().abs(), C_heads.abs())
    return BF16_ULP * decay[:, :, None] * mass


def decays(cache, slot: int, m: int, step: StepInputs, layer, first: int, count: int) -> torch.Tensor:
    """exp(A * S_{m+j}) [T, H]: from the checkpoint through ring entries 0..m-1 and query tokens 0..j."""
    ring = entries(cache.ring_dt)[slot, :m].double().sum(0)
    now = softplus_reference(step.dt[first : first + count] + layer.dt_bias).double().cumsum(0)
    return torch.exp(layer.A.double() * (ring + now))


# the output launch's forms: sums on the CUDA cores; the checkpoint reads as pipelined tensor-core products; the
# ring's product on the tensor cores too; and the programmatic dependent launch's form (the model's C, not the
# coefficient launch's fp32 copy, which it does not write then); and the coefficient launch with a group's heads in
# one program of 2 warps (capped at the group's power of two: 8 heads of one group in one tile, not two); and output
# programs that walk two heads of a group in one pipelined loop over their d_state tiles (without and with the ring's
# product on the tensor cores); and the checkpoint's tiles copied through a tensor descriptor (Hopper's TMA), per head
# and walking heads
FORMS = {"cuda-cores": {"mma_stages": 0}, "tensor-cores": {"mma_stages": 2},
         "tensor-cores-ring": {"mma_stages": 2, "mma_ring": True}, "pdl": {"mma_stages": 2, "pdl": True},
         "wide-coefficients": {"mma_stages": 0, "coef_head_chunk": 16, "coef_num_warps": 2},
         "heads-walked": {"mma_stages": 2, "heads_per_program": 2},
         "heads-walked-ring": {"mma_stages": 2, "mma_ring": True, "heads_per_program": 2},
         "tma": {"mma_stages": 2, "tma": True},
         "tma-heads-walked": {"mma_stages": 2, "tma": True, "heads_per_program": 2}}  # fmt: skip


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("shape", "T"), VERIFY_SHAPES, ids=lambda v: str(v))
def test_verify_matches_reference_and_fp64(shape: Shape, T: int, form: str) -> None:
    """Rows at different cursors with 1..T query tokens (an empty and a nearly full history among them), a padding
    row with tokens, and a row that would overflow the ring (skipped); stale ring entries are NaN; d_state in two
    tiles (blocks that divide head_dim and d_state, and blocks that do not); each of the output launch's forms."""
    gen = seeded(shape, T, "verify")
    layer = make_layer(shape, gen)
    slots = shape.batch + 3
    perm = torch.randperm(slots, generator=gen)
    counts = [*[T, 1, max(T - 1, 1), T][: shape.batch], 2, T]  # + a padding row, + a row that would overflow
    history = [*[0, shape.ring_len - 1, 2, shape.ring_len - T][: shape.batch], 0, shape.ring_len - T + 1]
    indices = torch.cat([perm[: shape.batch], torch.tensor([-1]), perm[shape.batch : shape.batch + 1]]).to(torch.int32)
    write_pos = torch.tensor(history, dtype=torch.int32)
    qsl = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
    cache = make_cache(shape, slots, False, gen)
    fill_ring(shape, cache, indices[[*range(shape.batch), -1]].long(), write_pos[[*range(shape.batch), -1]], gen)
    step = tokens(shape, layer, int(qsl[-1]), gen)
    sentinel = torch.full((int(qsl[-1]), shape.nheads, shape.head_dim), 7.0)
    kw = {"D": layer.D, "dt_bias": layer.dt_bias, "block_n": max(shape.d_state // 2, 1), **FORMS[form]}
    results = []
    for fn in (replay_verify, replay_verify_reference):
        run = cache.clone()
        args = (step.x, step.dt, layer.A, step.B, step.C, run.ssm_state, run.ring_x, run.ring_B, run.ring_dt)
        results.append((fn(*args, indices, write_pos, qsl, T, out=sentinel.clone(), **kw), run))
    (y_tri, c_tri), (y_ref, c_ref) = results

    for row in range(shape.batch):
        first, count, slot = int(qsl[row]), counts[row], int(indices[row])
        h = ring_fp64_state(cache, indices[row : row + 1].long(), write_pos[row : row + 1].long(), layer.A)
        y_true, _ = truth_outputs(h, step, layer, first, count)
        span = slice(first, first + count)
        assert torch.isfinite(y_tri[span]).all()
        assert rel_err(y_tri[span], y_ref[span]) <= FP32_TOL, f"row {row}"
        assert rel_err(y_tri[span], y_true) <= FP32_TOL, f"row {row}"
        for run in (c_tri, c_ref):  # the T entries landed at m..m+T-1 of the row's slot
            at = slice(history[row], history[row] + count)
            assert torch.equal(entries(run.ring_x)[slot, at], step.x[span].to(shape.dtype))
            assert torch.equal(entries(run.ring_B)[slot, at], step.B[span].to(shape.dtype))
    for y in (y_tri, y_ref):  # padding and overflow rows: outputs untouched
        assert (y[int(qsl[-3]) :] == 7.0).all()
    for run in (c_tri, c_ref):
        assert torch.equal(run.ssm_state, cache.ssm_state), "a verify never writes the checkpoint"
        overflow = int(indices[-1])
        assert torch.equal(run.ring_x[overflow].nan_to_num(), cache.ring_x[overflow].nan_to_num())


def run_verify_steps(shape: Shape, T: int, split: bool, pattern: str, steps: int, form: str = "cuda-cores") -> None:
    """``steps`` verify steps of T tokens; accepted per row and step from ``pattern`` (all / none / mixed); the
    output launch in ``form`` (``FORMS``)."""
    gen = seeded(shape, T, split, pattern)
    layer = make_layer(shape, gen)
    rows = shape.batch
    indices = (torch.randperm(rows + 2, generator=gen)[:rows] + 1).to(torch.int32)  # block 0 is the null block
    cache = make_cache(shape, rows + 3, split, gen)
    buffer_len = shape.ring_len - T
    table = CursorTable(rows + 3, buffer_len, "cpu", stagger=True, verify_len=T)
    truth = cache.ssm_state[indices.long()].double()
    caches = {"triton": cache.clone(), "reference": cache.clone()}
    qsl = torch.arange(0, (rows + 1) * T, T, dtype=torch.int32)
    accepted = torch.ones(rows, dtype=torch.int32)  # vLLM forces 1 after a prefill (nothing pending then)
    folds = 0
    for t in range(steps):
        write_pos, fold_len = torch.full((rows,), -7, dtype=torch.int32), torch.full((rows,), -7, dtype=torch.int32)
        fold_list = (torch.full((rows,), -7, dtype=torch.int32), torch.full((1,), -7, dtype=torch.int32))
        table.verify_step(indices, qsl, accepted, write_pos, fold_len, fold_rows=fold_list[0], fold_count=fold_list[1])
        assert ((write_pos + T) <= shape.ring_len).all(), "a planned verify must fit the ring"
        folds += int((fold_len > 0).sum())
        step = tokens(shape, layer, rows * T, gen)
        decay_from = caches["triton"].clone()
        outs = {}
        for name, fn in (("triton", replay_verify_step), ("reference", replay_verify_step_reference)):
            run = caches[name]
            args = (step.x, step.dt, layer.A, step.B, step.C, run.ssm_state, run.ring_x, run.ring_B, run.ring_dt)
            outs[name] = fn(*args, indices, write_pos, fold_len, qsl, T, state_bf16=run.state_bf16, D=layer.D,
                            dt_bias=layer.dt_bias, pad_slot_id=NULL_BLOCK_ID, fold_list=fold_list,
                            out=torch.empty(rows * T, shape.nheads, shape.head_dim), **FORMS[form])  # fmt: skip
        if pattern == "all":
            accepted = torch.full((rows,), T, dtype=torch.int32)
        elif pattern == "none":
            accepted = torch.ones(rows, dtype=torch.int32)
        else:
            accepted = torch.randint(1, T + 1, (rows,), generator=gen, dtype=torch.int32)
        for row in range(rows):
            span = slice(row * T, (row + 1) * T)
            y_true, states = truth_outputs(truth[row : row + 1], step, layer, row * T, T)
            if split:
                folded = decay_from.clone()  # the checkpoint the verify read, after this step's fold
                slot = int(indices[row])
                m = int(write_pos[row])
                if fold_len[row] > 0:
                    folded.ssm_state[slot] = caches["triton"].ssm_state[slot]
                bound = verify_bound(folded, slot, step.C[span], decays(folded, slot, m, step, layer, row * T, T))
                bound = bound + FP32_TOL * y_true.abs().max()
            else:
                bound = FP32_TOL * y_true.abs().max()
            for name, y in outs.items():
                assert ((y[span].double() - y_true).abs() <= bound).all(), f"{name} step {t} row {row} {pattern}"
            truth[row] = states[int(accepted[row]) - 1][0]  # the committed state: after the accepted tokens
    assert folds >= rows, "every row must fold at least once"

    pending = table.take_pending(indices, torch.ones(rows, dtype=torch.bool), accepted)  # e.g. a prefill comes
    for run in caches.values():
        run_fold = run.clone()
        flush_ring_reference(run_fold.ssm_state, run_fold.ring_x, run_fold.ring_B, run_fold.ring_dt, layer.A,
                             indices, pending, state_bf16=run_fold.state_bf16)  # fmt: skip
        assert rel_err(run_fold.ssm_state[indices.long()], truth) <= FP32_TOL, "master after folding the commits"
        if split:
            assert rel_err(run.state_bf16[indices.long()], run.ssm_state[indices.long()]) <= BF16_ULP


@pytest.mark.parametrize("pattern", ["all", "none", "mixed"])
@pytest.mark.parametrize(("shape", "T"), VERIFY_SHAPES[:2], ids=lambda v: str(v))
def test_verify_steps_track_fp64_across_folds(shape: Shape, T: int, pattern: str) -> None:
    run_verify_steps(shape, T, split=False, pattern=pattern, steps=3 * (shape.ring_len - T) // T + 4)


@pytest.mark.parametrize(("pattern", "form"), [("all", "cuda-cores"), ("mixed", "cuda-cores"),
                                               ("mixed", "tensor-cores"), ("mixed", "tensor-cores-ring"),
                                               ("mixed", "pdl"), ("mixed", "heads-walked"), ("mixed", "tma"),
                                               ("mixed", "tma-heads-walked")])  # fmt: skip
def test_verify_steps_in_split_precision_stay_within_the_bf16_bound(pattern: str, form: str) -> None:
    """The bf16 copy read on the CUDA cores, or as tensor-core products: bf16 ones where C is bf16 (this shape's: the
    products are exact either way), as the model's C with ``pdl``, and with two heads walked by each program."""
    shape, T = VERIFY_SHAPES[1]
    run_verify_steps(shape, T, split=True, pattern=pattern, steps=8, form=form)


def test_verify_steps_with_the_ring_on_the_tensor_cores_track_fp64_across_folds() -> None:
    shape, T = VERIFY_SHAPES[0]
    run_verify_steps(shape, T, split=False, pattern="mixed", steps=3 * (shape.ring_len - T) // T + 4,
                     form="tensor-cores-ring")  # fmt: skip


@pytest.mark.parametrize(("shape_index", "knobs", "refusal"), [
    (0, {"mma_stages": 0, "mma_ring": True}, "mma_ring needs mma_stages > 0"),
    (0, {"mma_stages": 0, "pdl": True}, "pdl needs mma_stages > 0"),
    (0, {"mma_stages": 0, "heads_per_program": 2}, "heads_per_program > 1 needs mma_stages > 0"),
    (0, {"mma_stages": 0, "tma": True}, "tma needs mma_stages > 0"),
    # each program's heads share one B/C group: 3 heads per program over groups of 8 cannot
    (3, {"mma_stages": 2, "heads_per_program": 3}, "heads_per_program 3 does not divide the 8 heads of a group"),
], ids=["mma_ring", "pdl", "heads_per_program", "tma", "heads across groups"])  # fmt: skip
def test_verify_launch_knobs_that_cannot_run_are_refused(shape_index: int, knobs: dict, refusal: str) -> None:
    shape, T = VERIFY_SHAPES[shape_index]
    gen = seeded(shape, T, "refusal")
    layer = make_layer(shape, gen)
    cache = make_cache(shape, 2, False, gen)
    step = tokens(shape, layer, T, gen)
    args = (step.x, step.dt, layer.A, step.B, step.C, cache.ssm_state, cache.ring_x, cache.ring_B, cache.ring_dt)
    one = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match=refusal):
        replay_verify(*args, one, one, torch.tensor([0, T], dtype=torch.int32), T, **knobs)


def test_a_checkpoint_the_tensor_memory_accelerator_cannot_copy_is_refused_in_one_line() -> None:
    """Rows of 7 fp32 columns (28 bytes) are not 16-byte aligned: the TMA form names the layout and the way out; a
    cache of 16 columns gets a descriptor of one [16, 16] tile per copy."""
    with pytest.raises(
        ValueError,
        match=r"tma: the checkpoint \(shape \(2, 3, 5, 7\), strides \(105, 35, 7, 1\)\) "
        r"is not 16-byte aligned with contiguous columns; run this cache without",
    ):
        checkpoint_descriptor(torch.zeros(2, 3, 5, 7), 16, 16)
    descriptor = checkpoint_descriptor(torch.zeros(2, 3, 16, 16), 16, 16)
    assert (descriptor.shape, descriptor.block_shape) == ([2, 3, 16, 16], [1, 1, 16, 16])


def test_verify_plan_kernel_matches_its_reference() -> None:
    """Commit, fold and graph padding through the interpreted one-launch plan and its twin, over many steps with
    random acceptance and token counts (a 1-token row among them); both list the folding rows for the fold."""
    L, T, blocks = 4, 3, 10
    gen = seeded("verify-plan")
    slots = torch.tensor([4, 0, 7, 2, 0, 0], dtype=torch.int32)  # rows 4, 5: padding past real_rows
    seen = []
    for plan in (plan_verify_rows, plan_verify_rows_reference):
        table = CursorTable(blocks, L, "cpu", stagger=True, verify_len=T)
        gen = seeded("verify-plan")
        history = []
        for _ in range(12):
            counts = torch.randint(1, T + 1, (6,), generator=gen, dtype=torch.int32)
            qsl = torch.cat([torch.zeros(1, dtype=torch.int32), counts.cumsum(0).to(torch.int32)])
            accepted = torch.randint(0, T + 2, (6,), generator=gen, dtype=torch.int32)  # also out-of-range values
            write_pos, fold_len = torch.full((6,), -7, dtype=torch.int32), torch.full((6,), -7, dtype=torch.int32)
            fold_rows, fold_count = torch.full((6,), -7, dtype=torch.int32), torch.full((1,), -7, dtype=torch.int32)
            plan(slots, qsl, accepted, table.positions, table.pending, table.window_end, write_pos, fold_len, 4, L, T,
                 NULL_BLOCK_ID, fold_rows, fold_count)  # fmt: skip
            assert ((write_pos + counts <= L + T) | (slots == 0)).all()
            listed = fold_rows[: int(fold_count)].tolist()
            assert listed == (fold_len > 0).nonzero().squeeze(1).tolist(), "the folding rows, in row order"
            history.append((write_pos.tolist(), fold_len.tolist(), table.positions.tolist(), table.pending.tolist()))
        seen.append(history)
    assert seen[0] == seen[1]
    assert all(w[1] == 0 and f[1] == 0 and w[4:] == [0, 0] for w, f, _, _ in seen[0])
    assert any(max(f) > 0 for _, f, _, _ in seen[0])


def test_stale_ring_entries_past_the_history_never_reach_an_output() -> None:
    """NaN in every ring entry at or after write_pos (a rolled-back verify's leftovers) changes nothing."""
    shape, T = VERIFY_SHAPES[0]
    gen = seeded("stale")
    layer = make_layer(shape, gen)
    cache = make_cache(shape, 2, False, gen)
    fill_ring(shape, cache, torch.tensor([1]), torch.tensor([2]), gen)
    clean = cache.clone()
    entries(clean.ring_x)[1, 2:] = 0.0
    entries(clean.ring_B)[1, 2:] = 0.0
    entries(clean.ring_dt)[1, 2:] = 0.0
    step = tokens(shape, layer, T, gen)
    outs = []
    for run in (cache, clean):
        args = (step.x, step.dt, layer.A, step.B, step.C, run.ssm_state, run.ring_x, run.ring_B, run.ring_dt)
        one = torch.tensor([1], dtype=torch.int32)
        outs.append(replay_verify(*args, one, one * 2, torch.tensor([0, T], dtype=torch.int32), T, D=layer.D))
    assert torch.equal(outs[0], outs[1])
