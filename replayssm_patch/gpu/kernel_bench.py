"""GPU benchmark of the ReplaySSM kernels against vLLM's own selective_state_update (Nemotron-H-8B shapes).

    python -m replayssm_patch.gpu.kernel_bench --out DIR            # H200: finishes in under 3 minutes
    python -m replayssm_patch.gpu.kernel_bench --out DIR --smoke    # tiny shapes; runs on CPU (Triton interpreter)

(a) equivalence: 2,000 consecutive decode steps at batch 256 (128 heads x 64 head_dim x 128 state, 8 groups,
    ring 16, realistic A and dt, rows joining at staggered steps so cursors differ), replay path vs vLLM's
    selective_state_update (fp32 state); output relative error per step for an fp32 checkpoint (target
    <= 1e-4) and split precision, plus the final state after folding what is left in the ring. Without vLLM
    the fp64 reference recurrence is the baseline (said so in the output).
(b) timing (CUDA graphs of back-to-back calls, CUDA events): baseline fp32 / bf16 state, replay kernel
    (fp32 / bf16 checkpoint), flush (all rows, amortised over L) and a decode step (replay + the staggered
    flush of 1/L of the rows) at batch 1/8/16/32/64/128/256, with bytes moved and the share of the card's HBM peak; per
    checkpoint, the largest batch up to which vLLM's fp32-state kernel was faster at every batch goes to
    launch_config.json as the plugin's native batches (``native_max_batch``).
(c) speculative verify (MTP k = 3: T = 4 query tokens per row, rings of L + T, cursors at the steady state of
    acceptance length 3, so about 1 row in ceil(L / 3) folds), timed as (b): the whole ``replay_verify_step``,
    the verify alone, its coefficient launch alone and the fold launch alone, against vLLM's speculative
    selective_state_update (fp32 state, 1+k state blocks per request, the call ``VERIFY_BASELINE_CALL``) at the
    same batches, at the two largest with a ring of L = 28 as well, and at the largest with T = 1, 2 and 8 (the
    T-token products' share of the output launch); the verify's coefficient launch (heads per program, warps), then
    its output launch and its fold launch are swept at the largest batch first, and their winners go to
    launch_config.json (``verify_step``, the coefficient launch's as its ``coef_*`` knobs; ``fold``) if (d) holds them.
    The fold walks the plan's list of folding rows, as the plugin's does; a second fold row gives every (row, head)
    a program, as before the list.
(d) speculative verify equivalence: 250 verify steps at batch 256 through the builder's cursor plan, random
    acceptance, against the fp64 recurrence (``verify_equivalence``), with the shapes (c) chose.
Writes DIR/kernel_bench.json and DIR/kernel_bench.md, rewritten after each section so a crash keeps the rest.
Sections (c) and (d) are ``verify_bench`` and ``verify_equivalence``; what the sections share (shapes, the vLLM
baseline, caches, bytes moved) is ``mamba_bench_setup``.
"""

from __future__ import annotations

import json
import math
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
    registers_table,
    report_head,
    section_markdown,
    timing_method,
    timing_table,
)
from replayssm_patch.gpu.mamba_bench_setup import (
    PAD,
    SMOKE_PLAN,
    Baseline,
    Plan,
    Shape,
    TrafficModel,
    coef_tuning_of,
    filled_caches,
    flush_call,
    fold_tuning_of,
    scattered_slots,
    sweep_markdown,
    sweep_shapes,
    tuning_of,
)
from replayssm_patch.gpu.verify_bench import run_verify, verify_markdown
from replayssm_patch.gpu.verify_equivalence import run_verify_equivalence, verify_equivalence_markdown

if TYPE_CHECKING:  # torch and the kernels are imported lazily: TRITON_INTERPRET must be decided first
    import torch

    from replayssm_patch.kernels.synthetic import LayerParams, StepInputs


def main(argv: list[str] | None = None) -> int:
    run = open_bench(argv, __doc__.split("\n\n")[0], "kernel_bench", (Plan(), SMOKE_PLAN), render_markdown,
                     "skip the block-size sweep (use kernel defaults)")  # fmt: skip
    if run is None:
        return 2
    args, plan, device, report = run
    baseline = Baseline.load().checked(plan, device)
    report.data["meta"]["baseline"] = baseline.note
    print(f"[kernel_bench] device={device} baseline: {baseline.note}", flush=True)
    report.section("equivalence", lambda: run_equivalence(plan, device, baseline))
    report.section("timing", lambda: run_timing(plan, device, baseline, sweep=not args.no_sweep))
    report.section("verify", lambda: run_verify(plan, device, baseline, sweep=not args.no_sweep))
    verify = report.data["verify"]  # the verify and fold launch shapes the sweeps chose: the launch table's next
    report.section(
        "verify_equivalence",
        lambda: run_verify_equivalence(plan, device, verify.get("configs"), verify.get("fold_configs")),
    )
    if report.data["timing"]["status"] == "ok" and "sweep" in report.data["timing"]:
        tuned = args.out / "launch_config.json"
        checked = report.data["verify_equivalence"]  # the verify's winners enter the table only if they held fp64
        held = checked["status"] == "ok" and checked.get("ok", False)
        verify = report.data["verify"] if report.data["verify"]["status"] == "ok" and held else None
        tuned.write_text(json.dumps(tuned_launch_file(report.data["timing"], verify), indent=2) + "\n")
        print(f"[kernel_bench] fastest launch shapes in {tuned} (REPLAYSSM_LAUNCH_CONFIG={tuned} uses them)")
    print(f"[kernel_bench] wrote {report.json_path} and {report.md_path}", flush=True)
    return 0


# ----------------------------------------------------------------------------------------------- equivalence


def run_equivalence(plan: Plan, device: str, baseline: Baseline) -> dict[str, Any]:
    import torch

    from replayssm_patch.kernels import ReplayCache, decode_flush_len, flush_ring, replay_decode_step, ring_shapes
    from replayssm_patch.kernels.ground_truth import recurrence_step_fp64
    from replayssm_patch.kernels.synthetic import LayerParams, StepInputs

    H, P, N, G, L, batch = plan.nheads, plan.head_dim, plan.d_state, plan.ngroups, plan.buffer_len, plan.eq_batch
    gen = torch.Generator(device).manual_seed(1234)
    layer = LayerParams.random(H, gen, device)
    slots = batch + 8
    slot_of_row = torch.randperm(slots, generator=gen, device=device)[:batch].to(torch.int32)
    start = torch.arange(batch, device=device) % L  # row r joins at step r % L: every cursor position occurs
    h0 = torch.randn(batch, H, P, N, generator=gen, device=device)
    modes = {}
    for mode, split in (("fp32", False), ("split", True)):
        spec = ring_shapes(H, P, G, N, L, split_precision=split)
        modes[mode] = ReplayCache.allocate(slots, spec, model_dtype=torch.bfloat16, device=device, ring_fill=math.nan)
        modes[mode].set_checkpoint(slot_of_row, h0)
    use_vllm = baseline.fn is not None
    base_state = h0.clone() if use_vllm else h0.double()
    rows = torch.arange(batch, device=device, dtype=torch.int32)
    base_out = torch.zeros(batch, H, P, device=device)
    outs = {mode: torch.zeros(batch, H, P, device=device) for mode in modes}
    errors: dict[str, list[torch.Tensor]] = {mode: [] for mode in modes}
    all_active_from = int(start.max()) + 1

    for t in range(plan.eq_steps):
        inputs = StepInputs.random(batch, H, P, G, N, layer, gen, torch.bfloat16)
        active = start <= t
        write_pos = ((t - start).clamp_min(0) % L).to(torch.int32)
        flush_len = torch.where(active, decode_flush_len(write_pos, L), 0).to(torch.int32)
        if use_vllm:
            baseline.step(base_state, inputs, layer, torch.where(active, rows, PAD), base_out)
            y_base = base_out.double()
        else:
            y_base = _fp64_step(recurrence_step_fp64, base_state, inputs, layer, active, t >= all_active_from)
        y_base = torch.where(active[:, None, None], y_base, 0.0)
        for mode, cache in modes.items():
            replay_decode_step(
                inputs.x, inputs.dt, layer.A, inputs.B, inputs.C, cache.ssm_state, cache.ring_x, cache.ring_B,
                cache.ring_dt, torch.where(active, slot_of_row, PAD).to(torch.int32), write_pos, flush_len,
                state_bf16=cache.state_bf16, D=layer.D, dt_bias=layer.dt_bias, out=outs[mode],
            )  # fmt: skip
            diff = torch.where(active[:, None, None], outs[mode].double() - y_base, 0.0)
            errors[mode].append(torch.stack([diff.abs().max() / y_base.abs().max(), diff.norm() / y_base.norm()]))
        if t % 500 == 0 or t == plan.eq_steps - 1:
            print(f"[kernel_bench]   step {t + 1}/{plan.eq_steps}", flush=True)

    in_ring = ((plan.eq_steps - start) % L).to(torch.int32)  # entries each row still holds in its ring
    result: dict[str, Any] = {
        "baseline": baseline.note,
        "batch": batch,
        "steps": plan.eq_steps,
        "target": TARGET_REL_ERR,
    }
    for mode, cache in modes.items():
        per_step = torch.stack(errors[mode]).cpu()
        master = cache.ssm_state.clone()
        flush_ring(master, cache.ring_x, cache.ring_B, cache.ring_dt, layer.A, slot_of_row, in_ring)
        final = master[slot_of_row.long()].double()
        result[mode] = {
            **error_summary(per_step),
            "final_state_rel_err": ((final - base_state.double()).abs().max() / base_state.abs().max()).item(),
        }
    result["fp32_within_target"] = result["fp32"]["max_rel_err"] <= TARGET_REL_ERR
    return result


def _fp64_step(
    step_fn: Callable[..., torch.Tensor],
    state: torch.Tensor,
    inputs: StepInputs,
    layer: LayerParams,
    active: torch.Tensor,
    all_active: bool,
) -> torch.Tensor:
    """Advance only the active rows of the fp64 baseline state; returns y for every row (0 where inactive)."""
    import torch

    kwargs = {"D": layer.D, "dt_bias": layer.dt_bias}
    if all_active:
        return step_fn(state, inputs.x, inputs.dt, layer.A, inputs.B, inputs.C, **kwargs)
    idx = active.nonzero().squeeze(1)
    picked = inputs.rows(idx)
    h = state[idx]
    y_active = step_fn(h, picked.x, picked.dt, layer.A, picked.B, picked.C, **kwargs)
    state[idx] = h
    y = torch.zeros(state.shape[:3], dtype=torch.float64, device=state.device)
    y[idx] = y_active
    return y


# ---------------------------------------------------------------------------------------------------- timing


def run_timing(plan: Plan, device: str, baseline: Baseline, sweep: bool) -> dict[str, Any]:
    result: dict[str, Any] = {"method": timing_method(device), "rows": []}
    configs: dict[str, Shape | None] = {"fp32": None, "split": None}
    if sweep:
        bench = KernelSetup(plan, device, max(plan.batches))
        result["sweep"] = bench.sweep()
        configs = {mode: result["sweep"][mode]["best"] for mode in configs}
    result["configs"] = configs
    for batch in plan.batches:
        print(f"[kernel_bench]   timing batch {batch}", flush=True)
        bench = KernelSetup(plan, device, batch)
        result["rows"].extend(bench.table(baseline, configs))
    result["registers"] = compiled_registers(_replay_kernels())
    return result


def tuned_launch_file(timing: dict[str, Any], verify: dict[str, Any] | None = None) -> dict[str, Any]:
    """The sweeps' winners in the format ``REPLAYSSM_LAUNCH_CONFIG`` reads (kernels/launch_config.py): the decode
    step's, the verify's when its section swept, and per checkpoint the batches up to which vLLM's kernel (fp32
    state, which the native regime runs on) beat the ring's step (``native_max_batch``)."""
    native = {mode: native_max_batch(timing["rows"], BASELINE_FP32_ROW, ring_row(mode)) for mode in ("fp32", "split")}
    table = {"replay_step": _shape_entries(timing["configs"]), "native_max_batch": native}
    if verify is not None and "sweep" in verify:
        coefs = verify.get("coef_configs", {})
        table["verify_step"] = {mode: knobs | coef_tuning_of(coefs.get(mode))
                                for mode, knobs in _shape_entries(verify["configs"]).items()}  # fmt: skip
        table["fold"] = {mode: fold_tuning_of(cfg) for mode, cfg in verify["fold_configs"].items() if cfg}
    return table


def _shape_entries(configs: dict[str, Shape | None]) -> dict[str, dict[str, int]]:
    return {mode: tuning_of(cfg) for mode, cfg in configs.items() if cfg}


BASELINE_FP32_ROW = "baseline fp32 state"


def ring_row(mode: str) -> str:
    return f"decode step {mode} (1/L rows flushing)"


def _replay_kernels() -> tuple[Any, ...]:
    """The Mamba-2 kernels whose registers the timing section reports."""
    from replayssm_patch.kernels.cursor_plan import _cursor_plan_kernel
    from replayssm_patch.kernels.flush import _flush_kernel
    from replayssm_patch.kernels.replay_decode import _replay_step_kernel, _ring_coefficients_kernel

    return _replay_step_kernel, _ring_coefficients_kernel, _flush_kernel, _cursor_plan_kernel


class KernelSetup:
    """Caches and inputs for one batch size, with every timed call as a closure.

    The ReplaySSM caches are views into one page buffer per slot, as vLLM lays out a MambaSpec's tensors,
    and the batch rows use slots scattered over a pool 4x the batch (a server's live slots are never 0..B-1).
    """

    def __init__(self, plan: Plan, device: str, batch: int) -> None:
        import torch

        from replayssm_patch.kernels.synthetic import LayerParams, StepInputs

        self.plan, self.device, self.batch = plan, device, batch
        H, P, N, G, L = plan.nheads, plan.head_dim, plan.d_state, plan.ngroups, plan.buffer_len
        gen = torch.Generator(device).manual_seed(batch)
        self.layer = LayerParams.random(H, gen, device)
        self.inputs = StepInputs.random(batch, H, P, G, N, self.layer, gen, torch.bfloat16)
        pool = 4 * batch + 1
        self.indices = scattered_slots(pool, batch, gen)
        self.caches = filled_caches(plan, pool, self.indices, gen)
        rows = torch.arange(batch, device=device)
        self.write_pos = (rows % L).to(torch.int32)  # staggered cursors: on average (L-1)/2 earlier entries
        self.aligned_pos = torch.full((batch,), L - 1, dtype=torch.int32, device=device)
        self.flush_none = torch.zeros(batch, dtype=torch.int32, device=device)
        self.flush_staggered = torch.where(self.write_pos == L - 1, L, 0).to(torch.int32)  # 1/L of the rows
        self.flush_all = torch.full((batch,), L, dtype=torch.int32, device=device)
        self.out = torch.empty(batch, H, P, dtype=torch.bfloat16, device=device)
        self.base_state = {
            "fp32": torch.randn(pool, H, P, N, device=device),
            "bf16": torch.randn(pool, H, P, N, device=device).to(torch.bfloat16),
        }

    # -- calls ---------------------------------------------------------------------------------------------
    def step(self, mode: str, cfg: Shape | None, write_pos: torch.Tensor, flush_len: torch.Tensor) -> Callable[[], Any]:
        """The decode step as vLLM runs it, in one graph: coefficients, replay, and the fold over the flush rows,
        listed once beforehand as the builder's cursor plan lists them (not timed: one plan serves every layer)."""
        from replayssm_patch.kernels import replay_decode_step
        from replayssm_patch.kernels.decode_fold import flush_work_list

        cache, s, layer = self.caches[mode], self.inputs, self.layer
        tuning = tuning_of(cfg)
        rows, count = flush_work_list(flush_len, self.indices, write_pos, self.plan.buffer_len, PAD)
        return lambda: replay_decode_step(
            s.x, s.dt, layer.A, s.B, s.C, cache.ssm_state, cache.ring_x, cache.ring_B, cache.ring_dt, self.indices,
            write_pos, flush_len, flush_rows=rows, flush_count=count, state_bf16=cache.state_bf16, D=layer.D,
            dt_bias=layer.dt_bias, out=self.out, **tuning,
        )  # fmt: skip

    def materialise(self, mode: str) -> Callable[[], Any]:
        """The standalone flush launch (before a prefill), folding every row's full ring."""
        return flush_call(self.caches[mode], self.layer.A, self.indices, self.flush_all)

    def baseline(self, baseline: Baseline, state_dtype: str) -> Callable[[], Any]:
        return lambda: baseline.step(self.base_state[state_dtype], self.inputs, self.layer, self.indices, self.out)

    # -- measurements --------------------------------------------------------------------------------------
    def sweep(self) -> dict[str, Any]:
        """Best (block_p, block_n, num_warps) of the decode step with 1/L of the rows flushing, per mode."""
        return sweep_shapes(
            "step", lambda mode, cfg: self.step(mode, cfg, self.write_pos, self.flush_staggered), self.plan, self.device
        )

    def table(self, baseline: Baseline, configs: dict[str, Shape | None]) -> list[dict[str, Any]]:
        L, model = self.plan.buffer_len, TrafficModel(self.plan, self.batch)
        timed = TimedCalls("kernel_bench", self.plan, self.device, self.batch)
        measure = timed.measure
        if baseline.fn is not None:
            measure(BASELINE_FP32_ROW, self.baseline(baseline, "fp32"), model.baseline(4))
            measure("baseline bf16 state", self.baseline(baseline, "bf16"), model.baseline(2))
        for mode, state_bytes in (("fp32", 4), ("split", 2)):
            copy, cfg = (2 if mode == "split" else 0), configs[mode]
            replay = model.replay(state_bytes)
            measure(f"replay {mode} (no row flushing)", self.step(mode, cfg, self.write_pos, self.flush_none), replay)
            staggered = self.step(mode, cfg, self.write_pos, self.flush_staggered)
            measure(ring_row(mode), staggered, replay + model.fold(1.0 / L, state_bytes, copy))
            aligned = self.step(mode, cfg, self.aligned_pos, self.flush_all)
            measure(f"decode step {mode} (all rows flushing)", aligned, model.aligned(copy))
            measure(f"materialise flush {mode} (all rows)", self.materialise(mode), model.flush(1.0, copy))
        return timed.rows(BASELINE_FP32_ROW)


# -------------------------------------------------------------------------------------------------- markdown


def _equivalence_markdown(eq: dict[str, Any]) -> list[str]:
    lines = [
        f"{eq['steps']} consecutive decode steps, batch {eq['batch']}, vs {eq['baseline']}. "
        f"Relative error = max |y - y_base| / max |y_base| per step (target <= {eq['target']:g} for fp32).",
        "",
        "| checkpoint | worst step rel. err | at step | worst normwise | last step | final state | finite |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for mode in ("fp32", "split"):
        m = eq[mode]
        lines.append(
            f"| {mode} | {m['max_rel_err']:.2e} | {m['worst_step']} | {m['max_rel_err_norm']:.2e} | "
            f"{m['last_step_rel_err']:.2e} | {m['final_state_rel_err']:.2e} | {m['finite']} |"
        )
    return [*lines, "", f"fp32 within target: **{eq['fp32_within_target']}** ({eq['seconds']} s)", ""]


def _timing_markdown(timing: dict[str, Any]) -> list[str]:
    lines = [
        f"Method: {timing['method']}. Launch shapes (block_p, block_n, num_warps): {timing['configs']}.",
        "",
        *timing_table(timing["rows"]),
        "",
    ]
    return lines + sweep_markdown(timing.get("sweep", {}), "decode step") + registers_table(timing.get("registers", []))


def render_markdown(data: dict[str, Any]) -> str:
    return "\n".join([
        *report_head("ReplaySSM kernel benchmark", data.get("meta", {})),
        *section_markdown(data, "equivalence", "Layer-level equivalence", _equivalence_markdown),
        *section_markdown(data, "timing", "Kernel timing", _timing_markdown),
        *section_markdown(data, "verify", "Speculative verify timing", verify_markdown),
        *section_markdown(data, "verify_equivalence", "Speculative verify equivalence", verify_equivalence_markdown),
    ])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
