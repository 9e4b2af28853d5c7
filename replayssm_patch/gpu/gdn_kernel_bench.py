"""GPU benchmark of ReplaySSM's Gated DeltaNet decode step against vLLM's own GDN decode (Qwen3.5-4B shapes).

    python -m replayssm_patch.gpu.gdn_kernel_bench --out DIR            # H200: about a minute
    python -m replayssm_patch.gpu.gdn_kernel_bench --out DIR --smoke    # tiny shapes; CPU (Triton interpreter)

(a) equivalence: 2,000 consecutive decode steps at batch 256 (32 value heads, 16 key heads, head dims 128,
    ring 16, realistic gates from ``gdn_synthetic``, rows joining at staggered steps so cursors differ),
    ``gdn_decode_step`` (fp32 checkpoint) vs vLLM's ``fused_recurrent_gated_delta_rule_packed_decode`` (fp32
    state), the kernel vLLM's layer runs on a pure-decode step; worst per-step output error and the checkpoint
    error after folding what is left in the rings (target <= 1e-4 relative: the fold runs tf32x3 on the GPU).
    Without vLLM the fp64 recurrence (``gdn_ground_truth``) is the baseline, and the output says so. Then the
    same in split precision (the replay reads a bf16 copy, flushes replay the window exactly): the target holds
    for the checkpoint; outputs carry the copy's rounding and are reported. Then the same steps through the
    one-launch kernel of a mixed step's decode rows (``gdn_mixed_decode``, bf16 conv
    inside) against vLLM's ``causal_conv1d_update`` and ``gdn_decode_step``: outputs, final checkpoints and
    conv states.
(b) launch-shape sweep at the largest batch, of the replay launch (block_v x num_warps, only shapes that ptxas
    compiles without spills, ``compile_check``), then of the fold launch with the fastest replay; the fastest
    pair goes to DIR/gdn_launch_config.json as the ``"gdn"`` entry of a launch table (``launch_config``:
    REPLAYSSM_LAUNCH_CONFIG=<file> makes the plugin use it; the H200's committed table holds the measured best).
(c) timing (CUDA graphs of back-to-back calls, CUDA events) at batch 1/8/16/32/64/128/256 on paged states, slots
    scattered over a pool 4x the batch: vLLM's decode, ReplaySSM's step with 1/L of the rows flushing
    (staggered), the replay alone (no row flushing), all rows flushing (aligned), the first two in split
    precision too, and the one-launch step of a mixed step's decode rows (``gdn_mixed_decode``, conv inside,
    1/L flushing), with bytes moved, share of HBM peak and the speed-up; per checkpoint, the largest batch up to
    which vLLM's decode was faster at every batch goes to gdn_launch_config.json as the plugin's native batches
    (``gdn_native_max_batch``).
Writes DIR/gdn_kernel_bench.json and .md, rewritten after each section so a crash keeps the rest.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from replayssm_patch.gpu.bench_common import (
    TARGET_REL_ERR,
    TimedCalls,
    compiled_registers,
    error_summary,
    native_max_batch,
    open_bench,
    ranked_shapes,
    registers_table,
    report_head,
    section_markdown,
    time_shapes,
    timing_method,
    timing_table,
    vllm_kernel,
)
from replayssm_patch.gpu.gdn_bench_setup import (
    CONV_WIDTH,
    Baseline,
    PackedInputs,
    Plan,
    TrafficModel,
    paged_gdn_tensors,
    relative_error,
    state_shape,
)

if TYPE_CHECKING:  # torch and the kernels are imported lazily: TRITON_INTERPRET must be decided first
    import torch

    from replayssm_patch.kernels.gdn_synthetic import GdnLayerParams

NULL_SLOT = 0  # vLLM 0.24's packed decode skips rows whose state index is <= 0 (its null block)
PAD = -1  # ReplaySSM's padding rows
REPLAY_KNOBS = ("replay_block_v", "replay_num_warps", "replay_mma_stages")  # a swept replay shape's parts, in order
FOLD_KNOBS = ("fold_block_v", "fold_num_warps", "fold_maxnreg", "fold_programs_per_sm")  # and a fold shape's
SPLIT_FOLD_KNOBS = ("split_fold_block_v", "split_fold_num_warps", "split_fold_programs_per_sm")  # split precision's


SMOKE_PLAN = Plan(
    num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=32, buffer_len=4, eq_batch=3, eq_steps=10,
    batches=(2,), warmup=1, graph_calls=1, repeats=1, replay_shapes=((16, 2), (32, 4), (16, 1, 2)),
    fold_shapes=((16, 4), (16, 4, 128, 4)), split_fold_shapes=((16, 4, 4), (8, 1, 16)),
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    run = open_bench(argv, __doc__.split("\n\n")[0], "gdn_kernel_bench", (Plan(), SMOKE_PLAN), render_markdown,
                     "skip the launch-shape sweep (kernel defaults)")  # fmt: skip
    if run is None:
        return 2
    args, plan, device, report = run
    baseline = Baseline.load().checked(plan, device)
    report.data["meta"]["baseline"] = baseline.note
    report.log(f"device={device} baseline: {baseline.note}")
    report.section("equivalence", lambda: run_equivalence(plan, device, baseline))
    report.section("split_equivalence", lambda: run_equivalence(plan, device, baseline, split=True))
    report.section("mixed_equivalence", lambda: run_mixed_equivalence(plan, device))
    if not args.no_sweep:
        report.section("sweep", lambda: run_sweep(plan, device))
    sweep = report.data.get("sweep", {})
    launch = launch_of(sweep["best"]) if sweep.get("status") == "ok" else None
    report.section("timing", lambda: run_timing(plan, device, baseline, launch))
    if launch is not None:
        tuned = args.out / "gdn_launch_config.json"
        rows = report.data["timing"].get("rows", [])
        native = {mode: native_max_batch(rows, BASELINE_ROW, row) for mode, row in NATIVE_ROWS.items()}
        table = {"gdn": sweep["best"], "gdn_native_max_batch": native}
        tuned.write_text(json.dumps(table, indent=2) + "\n")
        report.log(f"fastest launch shapes in {tuned} (REPLAYSSM_LAUNCH_CONFIG={tuned} makes the plugin use them)")
    report.log(f"wrote {report.json_path} and {report.md_path}")
    return 0


# ----------------------------------------------------------------------------------------------- equivalence


def run_equivalence(plan: Plan, device: str, baseline: Baseline, split: bool = False) -> dict[str, Any]:
    """The decode step against the baseline over ``plan.eq_steps`` steps (``split``: in split precision, where the
    target holds for the checkpoint only)."""
    import torch

    from replayssm_patch.kernels import GdnReplayCache, gdn_decode_step, gdn_flush_ring
    from replayssm_patch.kernels import gdn_ring_shapes as ring_shapes
    from replayssm_patch.kernels.gdn_ground_truth import gdn_recurrence_step
    from replayssm_patch.kernels.gdn_synthetic import GdnLayerParams

    L, batch = plan.buffer_len, plan.eq_batch
    gen = torch.Generator(device).manual_seed(1234)
    layer = GdnLayerParams.random(plan.num_v_heads, gen, device)
    slots, slot_of_row, start = staggered_rows(plan, gen, device)
    spec = ring_shapes(plan.num_k_heads, plan.num_v_heads, plan.head_k_dim, plan.head_v_dim, L, split)
    # stale entries: never read
    cache = GdnReplayCache.allocate(slots, spec, model_dtype=torch.bfloat16, device=device, ring_fill=math.nan)
    h0 = torch.randn(batch, *state_shape(plan), generator=gen, device=device)
    cache.set_checkpoint(slot_of_row, h0)
    use_vllm = baseline.fn is not None
    if use_vllm:
        base_state = torch.zeros_like(cache.ssm_state)
        base_state[slot_of_row.long()] = h0
    else:
        base_state = h0.double()  # dense rows
    base_out = torch.zeros(batch, plan.num_v_heads, plan.head_v_dim, device=device)
    ours = torch.zeros_like(base_out)
    errors = []
    for t in range(plan.eq_steps):
        inputs = PackedInputs.random(plan, batch, layer, gen)
        active, write_pos, flush_len = cursors_at(t, start, L)
        if use_vllm:
            baseline.step(base_state, inputs, layer, torch.where(active, slot_of_row, NULL_SLOT), base_out)
            y_base = base_out.double()
        else:
            y_base = _fp64_step(gdn_recurrence_step, base_state, inputs, layer, active)
        y_base = torch.where(active[:, None, None], y_base, 0.0)
        gdn_decode_step(
            *inputs.fields(), layer.A_log, layer.dt_bias, cache.ssm_state, cache.ring_k, cache.ring_u, cache.ring_g,
            torch.where(active, slot_of_row, PAD).to(torch.int32), write_pos, flush_len, pad_slot_id=PAD, out=ours,
            split=cache.split,
        )  # fmt: skip
        diff = torch.where(active[:, None, None], ours.double() - y_base, 0.0)
        errors.append(torch.stack([diff.abs().max() / y_base.abs().max(), diff.norm() / y_base.norm()]))
        if t % 500 == 0 or t == plan.eq_steps - 1:
            print(f"[gdn_kernel_bench]   step {t + 1}/{plan.eq_steps}", flush=True)

    in_ring = ((plan.eq_steps - start) % L).to(torch.int32)  # entries each row still holds in its ring
    folded = cache.clone()
    gdn_flush_ring(folded.ssm_state, folded.ring_k, folded.ring_u, folded.ring_g, slot_of_row, in_ring,
                   pad_slot_id=PAD, split=folded.split)  # fmt: skip
    final_base = base_state[slot_of_row.long()] if use_vllm else base_state
    per_step = torch.stack(errors).cpu()
    result = {
        "baseline": baseline.note,
        "checkpoint": "split" if split else "fp32",
        "batch": batch,
        "steps": plan.eq_steps,
        "target": TARGET_REL_ERR,
        **error_summary(per_step),
        "final_state_rel_err": relative_error(folded.ssm_state[slot_of_row.long()], final_base),
    }
    held = [result["final_state_rel_err"]] + ([] if split else [result["max_rel_err"]])
    result["within_target"] = max(held) <= TARGET_REL_ERR
    return result


def staggered_rows(plan: Plan, gen: torch.Generator, device: str) -> tuple[int, torch.Tensor, torch.Tensor]:
    """The equivalence sections' layout: a pool of slots, each row's slot (never 0, vLLM's null block) and the step
    it joins at (row r at step r % L, so every cursor position occurs)."""
    import torch

    slots = plan.eq_batch + 8
    slot_of_row = (torch.randperm(slots - 1, generator=gen, device=device)[: plan.eq_batch] + 1).to(torch.int32)
    return slots, slot_of_row, torch.arange(plan.eq_batch, device=device) % plan.buffer_len


def cursors_at(t: int, start: torch.Tensor, L: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step t's active rows, write positions and flush lengths, as the builder drives them (flush at L - 1)."""
    import torch

    from replayssm_patch.kernels import decode_flush_len

    active = start <= t
    write_pos = ((t - start).clamp_min(0) % L).to(torch.int32)
    return active, write_pos, torch.where(active, decode_flush_len(write_pos, L), 0).to(torch.int32)


def run_mixed_equivalence(plan: Plan, device: str) -> dict[str, Any]:
    """The one-launch kernel of a mixed step's decode rows (``gdn_mixed_decode``, conv inside) against what it
    replaces, vLLM's ``causal_conv1d_update`` then ``gdn_decode_step``, over the same steps and rows as the
    equivalence section, each arm on its own copy of the paged states; bf16 activations and conv state."""
    import torch

    from replayssm_patch.gdn_state_layout import RING_G, RING_K, RING_U
    from replayssm_patch.kernels import gdn_decode_step, gdn_mixed_decode
    from replayssm_patch.kernels.gdn_mixed_decode import causal_conv_update_reference
    from replayssm_patch.kernels.gdn_synthetic import GdnLayerParams

    conv_update, note = vllm_kernel("vllm.model_executor.layers.mamba.ops.causal_conv1d", "causal_conv1d_update",
                                    "causal_conv1d_update")  # fmt: skip
    if conv_update is None:
        note = "PyTorch causal conv (vLLM's not importable) then gdn_decode_step"
    gen = torch.Generator(device).manual_seed(4321)
    layer = GdnLayerParams.random(plan.num_v_heads, gen, device)
    slots, slot_of_row, start = staggered_rows(plan, gen, device)
    arms = [paged_gdn_tensors(plan, slots, replay=True, device=device) for _ in range(2)]
    for index, scale in ((0, 1.0), (1, 1.0), (RING_K, 0.0), (RING_U, 0.0), (RING_G, 0.0)):
        start_value = torch.randn(arms[0][index].shape, generator=gen, device=device) * scale
        for tensors in arms:
            tensors[index].copy_(start_value)
    weight = (torch.randn(arms[0][0].shape[1], CONV_WIDTH, generator=gen, device=device) * 0.5).to(torch.bfloat16)
    outs = [torch.zeros(plan.eq_batch, plan.num_v_heads, plan.head_v_dim, device=device) for _ in arms]
    errors = []
    for t in range(plan.eq_steps):
        inputs = PackedInputs.random(plan, plan.eq_batch, layer, gen)  # its packed tensor is the pre-conv input
        active, write_pos, flush_len = cursors_at(t, start, plan.buffer_len)
        rows = torch.where(active, slot_of_row, PAD).to(torch.int32)
        one, three = arms
        gdn_mixed_decode(
            inputs.mixed, one[0], weight, None, inputs.a, inputs.b, layer.A_log, layer.dt_bias, one[1], one[RING_K],
            one[RING_U], one[RING_G], rows, write_pos, flush_len, num_k_heads=plan.num_k_heads,
            head_k_dim=plan.head_k_dim, pad_slot_id=PAD, out=outs[0],
        )  # fmt: skip
        live = active.nonzero().squeeze(1)
        qkv = inputs.mixed.clone()
        if conv_update is not None:
            qkv[live] = conv_update(qkv[live], three[0], weight, None, "silu", conv_state_indices=rows[live])
        else:
            qkv[live] = causal_conv_update_reference(qkv[live], three[0], weight, None, rows[live], "silu")
        gdn_decode_step(
            *plan.split_qkv(qkv), inputs.a, inputs.b, layer.A_log, layer.dt_bias, three[1], three[RING_K],
            three[RING_U], three[RING_G], rows, write_pos, flush_len, pad_slot_id=PAD, out=outs[1],
        )  # fmt: skip
        diff = (outs[0].double() - outs[1].double())[live]
        want = outs[1].double()[live]
        errors.append(torch.stack([diff.abs().max() / want.abs().max(), diff.norm() / want.norm()]))
    used = slot_of_row.long()
    result = {
        "baseline": note, "batch": plan.eq_batch, "steps": plan.eq_steps, "target": TARGET_REL_ERR,
        **error_summary(torch.stack(errors).cpu()),
        "final_state_rel_err": relative_error(arms[0][1][used], arms[1][1][used]),
        "conv_state_equal": bool(torch.equal(arms[0][0][used], arms[1][0][used])),
    }  # fmt: skip
    result["within_target"] = max(result["max_rel_err"], result["final_state_rel_err"]) <= TARGET_REL_ERR
    return result


def _fp64_step(
    step_fn: Callable[..., torch.Tensor],
    state: torch.Tensor,
    inputs: PackedInputs,
    layer: GdnLayerParams,
    active: torch.Tensor,
) -> torch.Tensor:
    """Advance only the active rows of the dense fp64 baseline state; o for every row (0 where inactive)."""
    import torch

    idx = active.nonzero().squeeze(1)
    h = state[idx]
    o_active = step_fn(h, *inputs.rows(idx), layer.A_log, layer.dt_bias)
    state[idx] = h
    o = torch.zeros(state.shape[:3], dtype=torch.float64, device=state.device)
    o[idx] = o_active
    return o


# -------------------------------------------------------------------------------------------- sweep, timing


def run_sweep(plan: Plan, device: str) -> dict[str, Any]:
    """Time the decode step (1/L rows flushing) at the largest batch for each spill-free replay launch shape
    (default fold), then for each fold launch shape with the fastest replay shape, then in split precision for each
    of its fold shapes with the fastest two."""
    setup = KernelSetup(plan, device, max(plan.batches))
    spills = {"x".join(map(str, shape)): replay_spills(plan, *shape) for shape in plan.replay_shapes}
    replay = {"x".join(map(str, shape)): dict(zip(REPLAY_KNOBS, shape, strict=False)) for shape in plan.replay_shapes}
    timings = setup.sweep({name: shape for name, shape in replay.items() if not spills[name]}, "replay")
    for name in (name for name, spilled in spills.items() if spilled):
        print(f"[gdn_kernel_bench]   sweep {name}: skipped, {spills[name]} B spilled", flush=True)
    best_replay = replay[min(timings, key=timings.__getitem__)]
    folds = {"x".join(map(str, shape)): best_replay | dict(zip(FOLD_KNOBS, shape, strict=False))
             for shape in plan.fold_shapes}  # fmt: skip
    fold_timings = setup.sweep(folds, "fold")
    best_fold = folds[min(fold_timings, key=fold_timings.__getitem__)]
    splits = {"x".join(map(str, shape)): best_fold | dict(zip(SPLIT_FOLD_KNOBS, shape, strict=True))
              for shape in plan.split_fold_shapes}  # fmt: skip
    split_timings = setup.sweep(splits, "split fold", split=True)
    best = splits[min(split_timings, key=split_timings.__getitem__)]
    print(f"[gdn_kernel_bench]   sweep: best {launch_of(best).as_key()} ({min(fold_timings.values()):.1f} us, "
          f"split {min(split_timings.values()):.1f} us)", flush=True)  # fmt: skip
    return {"batch": setup.batch, "spill_bytes": spills, "us": timings, "fold_us": fold_timings,
            "split_fold_us": split_timings, "best": best}  # fmt: skip


def launch_of(knobs: dict[str, int]) -> Any:
    """The plugin's launch-shape record (``launch_config.GdnLaunch``) from a sweep's knobs."""
    from replayssm_patch.kernels.launch_config import GdnLaunch

    return GdnLaunch(**knobs)


def replay_spills(plan: Plan, block_v: int, num_warps: int, mma_stages: int = 0) -> int | None:
    """Spill bytes ptxas reports for the replay launch at this shape (compile_check, sm_90); None where it cannot
    tell: under the interpreter, for block sizes other than compile_check's Qwen3.5 ones, or if compiling failed."""
    if os.environ.get("TRITON_INTERPRET") == "1" or not plan.qwen35_blocks:
        return None
    from replayssm_patch.kernels.compile_check import compile_for_hopper, gdn_replay_variant

    _, kernel, pointers, consts, warps = gdn_replay_variant(block_v, num_warps, mma_stages)
    try:
        return compile_for_hopper(kernel, pointers, consts, warps).spill_bytes
    except Exception as exc:  # no ptxas here, say: time the shape anyway rather than lose the sweep
        print(f"[gdn_kernel_bench]   spill check {block_v}x{num_warps}x{mma_stages} failed: {exc!r}", flush=True)
        return None


def run_timing(plan: Plan, device: str, baseline: Baseline, launch: Any) -> dict[str, Any]:
    """The timing rows at every batch with ``launch`` (a ``GdnLaunch``; None: the kernel defaults)."""
    from replayssm_patch.kernels.launch_config import GDN_DEFAULT

    launch = launch or GDN_DEFAULT
    result: dict[str, Any] = {"method": timing_method(device), "launch": launch.as_key(), "rows": []}
    for batch in plan.batches:
        print(f"[gdn_kernel_bench]   timing batch {batch}", flush=True)
        result["rows"].extend(KernelSetup(plan, device, batch).table(baseline, launch))
    result["registers"] = compiled_registers(_gdn_kernels())
    return result


def _gdn_kernels() -> tuple[Any, ...]:
    from replayssm_patch.kernels.gdn_coefficients import _gdn_coefficients_kernel
    from replayssm_patch.kernels.gdn_decode import _gdn_replay_kernel
    from replayssm_patch.kernels.gdn_fold import _gdn_fold_kernel
    from replayssm_patch.kernels.gdn_mixed_decode import _gdn_mixed_decode_kernel

    return _gdn_coefficients_kernel, _gdn_replay_kernel, _gdn_fold_kernel, _gdn_mixed_decode_kernel


class KernelSetup:
    """Paged states and inputs for one batch size, with every timed call as a closure.

    The states are views into one page per slot, laid out by the plugin's MambaSpec functions (conv state,
    checkpoint, ring) as vLLM packs them, and the batch rows use slots scattered over a pool 4x the batch."""

    def __init__(self, plan: Plan, device: str, batch: int) -> None:
        import torch

        from replayssm_patch.gdn_state_layout import RING_G, RING_K, RING_U
        from replayssm_patch.kernels.gdn_synthetic import GdnLayerParams

        self.plan, self.device, self.batch = plan, device, batch
        L = plan.buffer_len
        gen = torch.Generator(device).manual_seed(batch)
        self.layer = GdnLayerParams.random(plan.num_v_heads, gen, device)
        self.inputs = PackedInputs.random(plan, batch, self.layer, gen)
        pool = 4 * batch + 1
        self.indices = (torch.randperm(pool - 1, generator=gen, device=device)[:batch] + 1).to(torch.int32)
        stock = paged_gdn_tensors(plan, pool, replay=False, device=device)
        stock[1].normal_(generator=gen)
        self.base_state = stock[1]
        tensors = paged_gdn_tensors(plan, pool, replay=True, device=device)
        tensors[1].normal_(generator=gen)
        tensors[RING_K].normal_(generator=gen)
        tensors[RING_U].normal_(generator=gen)
        tensors[RING_G].uniform_(-0.1, -1e-3, generator=gen)
        self.state, self.ring_k, self.ring_u, self.ring_g = (tensors[i] for i in (1, RING_K, RING_U, RING_G))
        self.conv_state = tensors[0].normal_(generator=gen)
        self.conv_weight = torch.randn(self.conv_state.shape[1], CONV_WIDTH, generator=gen, device=device) * 0.5
        self.conv_weight = self.conv_weight.to(torch.bfloat16)
        rows = torch.arange(batch, device=device)
        self.write_pos = (rows % L).to(torch.int32)  # staggered cursors: on average (L-1)/2 earlier entries
        self.aligned_pos = torch.full((batch,), L - 1, dtype=torch.int32, device=device)
        self.flush_none = torch.zeros(batch, dtype=torch.int32, device=device)
        self.flush_staggered = torch.where(self.write_pos == L - 1, L, 0).to(torch.int32)  # 1/L of the rows
        self.flush_all = torch.full((batch,), L, dtype=torch.int32, device=device)
        self.out = torch.empty(batch, plan.num_v_heads, plan.head_v_dim, dtype=torch.bfloat16, device=device)

    @functools.cached_property
    def split_tensors(self) -> list[torch.Tensor]:
        """Split precision's pages (a pool as large as the fp32 one, its own random fill), made only when a split
        row is timed: the sweep never needs them."""
        import torch

        from replayssm_patch.gdn_state_layout import RING_G

        gen = torch.Generator(self.device).manual_seed(self.batch + 1)
        tensors = paged_gdn_tensors(self.plan, self.state.shape[0], replay=True, device=self.device, split=True)
        for index, tensor in enumerate(tensors):
            if index == RING_G:
                tensor.uniform_(-0.1, -1e-3, generator=gen)
            else:
                tensor.normal_(generator=gen)
        return tensors

    def step(
        self, write_pos: torch.Tensor, flush_len: torch.Tensor, launch: Any, split: bool = False
    ) -> Callable[[], Any]:
        """ReplaySSM's decode step in one graph (coefficients, replay, fold) with ``launch`` (a ``GdnLaunch``; with
        ``split`` in split precision, on its own pages), its flush-row list made once beforehand as the builder's
        cursor plan makes it (not timed: one plan serves every layer)."""
        from replayssm_patch.gdn_state_layout import RING_BETA, RING_G, RING_K, RING_U, RING_V, STATE_BF16
        from replayssm_patch.kernels import GdnSplitTensors, gdn_decode_step
        from replayssm_patch.kernels.decode_fold import flush_work_list

        rows, count = flush_work_list(flush_len, self.indices, write_pos, self.plan.buffer_len, PAD)
        state, ring_k, ring_u, ring_g, extra = self.state, self.ring_k, self.ring_u, self.ring_g, None
        if split:
            t = self.split_tensors
            state, ring_k, ring_u, ring_g = t[1], t[RING_K], t[RING_U], t[RING_G]
            extra = GdnSplitTensors(state_bf16=t[STATE_BF16], ring_beta=t[RING_BETA], ring_v=t[RING_V])
        return lambda: gdn_decode_step(
            *self.inputs.fields(), self.layer.A_log, self.layer.dt_bias, state, ring_k, ring_u, ring_g, self.indices,
            write_pos, flush_len, flush_rows=rows, flush_count=count, pad_slot_id=PAD, out=self.out, launch=launch,
            split=extra,
        )  # fmt: skip

    def mixed_step(self) -> Callable[[], Any]:
        """The decode rows of a step with prefills in one launch, the causal conv inside (``gdn_mixed_decode``),
        1/L of the rows flushing: what each GDN layer runs eagerly in a mixed step instead of vLLM's conv update and
        the three launches above."""
        from replayssm_patch.kernels import gdn_mixed_decode

        p = self.plan
        return lambda: gdn_mixed_decode(
            self.inputs.mixed, self.conv_state, self.conv_weight, None, self.inputs.a, self.inputs.b,
            self.layer.A_log, self.layer.dt_bias, self.state, self.ring_k, self.ring_u, self.ring_g, self.indices,
            self.write_pos, self.flush_staggered, num_k_heads=p.num_k_heads, head_k_dim=p.head_k_dim,
            pad_slot_id=PAD, out=self.out,
        )  # fmt: skip

    def sweep(self, shapes: dict[str, dict[str, int]], label: str, split: bool = False) -> dict[str, float]:
        """µs of the decode step (1/L rows flushing; ``split``: in split precision) per named launch shape; a shape
        that fails is left out."""
        calls = {
            name: self.step(self.write_pos, self.flush_staggered, launch_of(knobs), split=split)
            for name, knobs in shapes.items()
        }
        return time_shapes("gdn_kernel_bench", label, calls, self.plan, self.device)

    def table(self, baseline: Baseline, launch: Any) -> list[dict[str, Any]]:
        model = TrafficModel(self.plan, self.batch)
        timed = TimedCalls("gdn_kernel_bench", self.plan, self.device, self.batch)
        measure = timed.measure
        if baseline.fn is not None:
            call = lambda: baseline.step(self.base_state, self.inputs, self.layer, self.indices, self.out)  # noqa: E731
            measure(BASELINE_ROW, call, model.baseline())
        staggered = self.step(self.write_pos, self.flush_staggered, launch)
        measure(RING_ROW, staggered, model.replay() + model.fold(1 / self.plan.buffer_len))
        measure("replay (no row flushing)", self.step(self.write_pos, self.flush_none, launch), model.replay())
        measure("decode step (all rows flushing)", self.step(self.aligned_pos, self.flush_all, launch), model.aligned())
        split_staggered = self.step(self.write_pos, self.flush_staggered, launch, split=True)
        measure(SPLIT_RING_ROW, split_staggered, model.replay(split=True) + model.fold(1 / self.plan.buffer_len, True))
        measure("split replay (no row flushing)", self.step(self.write_pos, self.flush_none, launch, split=True),
                model.replay(split=True))  # fmt: skip
        measure(MIXED_ROW, self.mixed_step(), model.replay() + model.fold(1 / self.plan.buffer_len) + model.conv())
        return timed.rows(BASELINE_ROW)


BASELINE_ROW = "vllm gdn decode (fp32 state)"
RING_ROW = "decode step (1/L rows flushing)"
SPLIT_RING_ROW = "split decode step (1/L rows flushing)"
NATIVE_ROWS = {"fp32": RING_ROW, "split": SPLIT_RING_ROW}  # each checkpoint's step against vLLM's decode
MIXED_ROW = "mixed-step decode rows, one launch with the conv (1/L rows flushing)"


# -------------------------------------------------------------------------------------------------- markdown


def _equivalence_markdown(eq: dict[str, Any]) -> list[str]:
    return [
        f"{eq['steps']} consecutive decode steps, batch {eq['batch']}, {eq.get('checkpoint', 'fp32')} checkpoint, "
        f"vs {eq['baseline']}. Relative error = max |o - o_base| / max |o_base| per step (target <= {eq['target']:g}"
        + (
            "; split precision: for the checkpoint, outputs carry the bf16 copy's rounding)."
            if eq.get("checkpoint") == "split"
            else ")."
        ),
        "",
        "| worst step rel. err | at step | worst normwise | last step | checkpoint after final fold | finite |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| {eq['max_rel_err']:.2e} | {eq['worst_step']} | {eq['max_rel_err_norm']:.2e} | "
        f"{eq['last_step_rel_err']:.2e} | {eq['final_state_rel_err']:.2e} | {eq['finite']} |",
        "",
        f"Within target: **{eq['within_target']}** ({eq['seconds']} s)"
        + ("" if "conv_state_equal" not in eq else f"; conv states equal: **{eq['conv_state_equal']}**"),
        "",
    ]


def _sweep_markdown(sweep: dict[str, Any]) -> list[str]:
    skipped = [name for name, spilled in sweep["spill_bytes"].items() if spilled]
    return [
        f"Decode step (1/L rows flushing) at batch {sweep['batch']}, us. "
        f"Replay, block_v x num_warps[ x mma_stages] (default fold): {ranked_shapes(sweep['us'])}. "
        f"Fold, block_v x num_warps[ x maxnreg x programs per SM] (fastest replay): "
        f"{ranked_shapes(sweep.get('fold_us', {}))}. "
        f"Split precision's fold, block_v x num_warps x programs per SM (fastest replay and fold, split step): "
        f"{ranked_shapes(sweep.get('split_fold_us', {}))}.",
        f"Skipped (ptxas spills): {', '.join(skipped) or 'none'}. Fastest: {launch_of(sweep['best']).as_key()}.",
        "",
    ]


def _timing_markdown(timing: dict[str, Any]) -> list[str]:
    return [
        f"Method: {timing['method']}. Launch shapes (block_v x num_warps): {timing['launch']}.",
        "",
        *timing_table(timing["rows"]),
        "",
        *registers_table(timing.get("registers", [])),
    ]


def render_markdown(data: dict[str, Any]) -> str:
    return "\n".join([
        *report_head("ReplaySSM Gated DeltaNet kernel benchmark", data.get("meta", {})),
        *section_markdown(data, "equivalence", "Equivalence", _equivalence_markdown),
        *section_markdown(data, "split_equivalence", "Equivalence in split precision", _equivalence_markdown),
        *section_markdown(data, "mixed_equivalence", "Mixed-step decode rows in one launch", _equivalence_markdown),
        *section_markdown(data, "sweep", "Launch-shape sweep", _sweep_markdown),
        *section_markdown(data, "timing", "Timing", _timing_markdown),
    ])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
