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
    flush of 1/L of the rows) at batch 64/128/256, with bytes moved and the share of 4.3 TB/s HBM.
(c) speculative verify (MTP k = 3: T = 4 query tokens per row, rings of L + T, cursors at the steady state of
    acceptance length 3, so about 1 row in ceil(L / 3) folds), timed as (b): the whole ``replay_verify_step``,
    the verify alone and the fold launch alone, against vLLM's speculative selective_state_update (fp32 state,
    1+k state blocks per request, the call ``VERIFY_BASELINE_CALL``) at the same batches.
Writes DIR/kernel_bench.json and DIR/kernel_bench.md, rewritten after each section so a crash keeps the rest.
"""

from __future__ import annotations

import inspect
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from replayssm_patch.gpu.bench_common import (
    TARGET_REL_ERR,
    TimedCalls,
    compiled_registers,
    error_summary,
    open_bench,
    paged_tensors,
    probe_problem,
    registers_table,
    report_head,
    seconds_per_call,
    section_markdown,
    timing_method,
    timing_table,
)

if TYPE_CHECKING:  # torch and the kernels are imported lazily: TRITON_INTERPRET must be decided first
    import torch

    from replayssm_patch.kernels import ReplayCache
    from replayssm_patch.kernels.synthetic import LayerParams, StepInputs

CONV_WIDTH = 4  # Nemotron-H's conv kernel: vLLM keeps its last 3 inputs per channel
PAD = -1
SPEC_TOKENS = 3  # k, the drafts an MTP step verifies (issue 17's Nemotron-H-8B runs)
VERIFY_TOKENS = 1 + SPEC_TOKENS  # T, the query tokens of a verify row
ACCEPTANCE_LENGTH = 3  # tokens a verify commits (vLLM's synthetic acceptance length 3.0)


@dataclass(frozen=True)
class Plan:
    """Shapes and effort of one benchmark run."""

    nheads: int = 128
    head_dim: int = 64
    d_state: int = 128
    ngroups: int = 8
    buffer_len: int = 16
    eq_batch: int = 256
    eq_steps: int = 2000
    batches: tuple[int, ...] = (64, 128, 256)
    warmup: int = 3
    graph_calls: int = 20  # calls captured per CUDA graph
    repeats: int = 5  # graph replays timed
    # (block_p, block_n, num_warps) of the replay step: 1-2-warp programs as vLLM's SSU uses, a few wider ones
    step_configs: tuple[tuple[int, int, int], ...] = (
        (4, 128, 1), (8, 64, 1), (8, 128, 1), (16, 32, 1), (16, 64, 1), (16, 128, 1), (16, 64, 2), (32, 64, 2),
        (32, 128, 2), (64, 64, 4),
    )  # fmt: skip


SMOKE_PLAN = Plan(
    nheads=4, head_dim=8, d_state=16, ngroups=2, buffer_len=4, eq_batch=3, eq_steps=6, batches=(2,),
    warmup=1, graph_calls=1, repeats=1, step_configs=((16, 64, 1), (8, 16, 2)),
)  # fmt: skip


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
    report.section("verify", lambda: run_verify(plan, device, baseline))
    if report.data["timing"]["status"] == "ok" and "sweep" in report.data["timing"]:
        tuned = args.out / "launch_config.json"
        tuned.write_text(json.dumps(tuned_launch_file(report.data["timing"]), indent=2) + "\n")
        print(f"[kernel_bench] fastest launch shapes in {tuned} (REPLAYSSM_LAUNCH_CONFIG={tuned} uses them)")
    print(f"[kernel_bench] wrote {report.json_path} and {report.md_path}", flush=True)
    return 0


@dataclass(frozen=True)
class Baseline:
    """vLLM's selective_state_update if importable, else None (the fp64 reference stands in for equivalence)."""

    fn: Callable[..., Any] | None
    note: str

    @classmethod
    def load(cls) -> Baseline:
        try:
            from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_state_update
        except Exception as exc:
            return cls(None, f"fp64 reference recurrence (vLLM selective_state_update not importable: {exc!r})")
        import vllm

        return cls(selective_state_update, f"vllm {vllm.__version__} selective_state_update")

    def step(
        self, state: torch.Tensor, inputs: StepInputs, layer: LayerParams, indices: torch.Tensor, out: torch.Tensor
    ) -> None:
        """One baseline decode step, called the way vLLM's MambaMixer2 calls it (head_dim-expanded A/dt/D)."""
        self._call(state, inputs, layer, out, state_batch_indices=indices)

    def verify(
        self, state: torch.Tensor, inputs: StepInputs, layer: LayerParams, blocks: torch.Tensor,
        num_accepted: torch.Tensor, query_start_loc: torch.Tensor, out: torch.Tensor,
    ) -> None:  # fmt: skip
        """One speculative verify as vLLM 0.24's MambaMixer2 runs it: ``blocks`` [batch, 1+k] are each request's
        state blocks (source and destination alike, as without prefix caching), the initial state is read from
        block num_accepted-1 and the state after query token t is written to block t; ``inputs`` hold the
        batch x (1+k) tokens, row r's at query_start_loc[r]..query_start_loc[r+1]-1."""
        self._call(
            state, inputs, layer, out, state_batch_indices=blocks, dst_state_batch_indices=blocks,
            num_accepted_tokens=num_accepted, cu_seqlens=query_start_loc,
        )  # fmt: skip

    def _call(
        self, state: torch.Tensor, inputs: StepInputs, layer: LayerParams, out: torch.Tensor, **indexing: Any
    ) -> None:
        assert self.fn is not None
        P, N = inputs.x.shape[2], inputs.B.shape[2]
        kwargs = {
            "D": layer.D[:, None].expand(-1, P),
            "z": None,
            "dt_bias": layer.dt_bias[:, None].expand(-1, P),
            "dt_softplus": True,
            "pad_slot_id": PAD,  # older vLLM
            "null_block_id": PAD,  # vLLM 0.24: rows whose index equals it are skipped (its default, 0, is a real row)
            "out": out,
            **indexing,
        }
        params = inspect.signature(self.fn).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            kwargs = {k: v for k, v in kwargs.items() if k in params}  # tolerate renamed / dropped options
        dt = inputs.dt[:, :, None].expand(-1, -1, P)
        A = layer.A[:, None, None].expand(-1, P, N)
        self.fn(state, inputs.x, dt, A, inputs.B, inputs.C, **kwargs)

    def checked(self, plan: Plan, device: str) -> Baseline:
        """This baseline if one call on a 2-row batch works, else the fp64 fallback saying why."""
        if self.fn is None:
            return self
        import torch

        from replayssm_patch.gpu.layer_check import relative_error
        from replayssm_patch.kernels.ground_truth import recurrence_step_fp64

        layer, inputs = _probe_inputs(plan, device, 2)
        state = torch.zeros(2, plan.nheads, plan.head_dim, plan.d_state, device=device)
        out = torch.full_like(inputs.x, float("nan"))

        def error() -> float:  # rows it skipped stay NaN, which fails the check too
            expected = recurrence_step_fp64(
                torch.zeros_like(state, dtype=torch.float64), inputs.x, inputs.dt, layer.A, inputs.B, inputs.C,
                D=layer.D, dt_bias=layer.dt_bias,
            )  # fmt: skip
            return relative_error(out, expected)

        rows = torch.arange(2, dtype=torch.int32, device=device)
        problem = probe_problem(self.note, lambda: self.step(state, inputs, layer, rows, out), error)
        return self if problem is None else Baseline(None, problem)

    def verify_problem(self, plan: Plan, device: str) -> str | None:
        """Why the speculative call cannot be the verify timing's baseline, None when it can: a 2-row probe (one
        row accepted 1 token last step, one all T) against the fp64 recurrence over its T tokens, outputs and the
        state written after the last token."""
        if self.fn is None:
            return self.note
        import torch

        from replayssm_patch.gpu.layer_check import relative_error
        from replayssm_patch.kernels.ground_truth import recurrence_step_fp64

        T = VERIFY_TOKENS
        layer, inputs = _probe_inputs(plan, device, 2 * T)
        state = torch.randn(1 + 2 * T, plan.nheads, plan.head_dim, plan.d_state, device=device)
        blocks = torch.arange(1, 1 + 2 * T, dtype=torch.int32, device=device).view(2, T)
        accepted = torch.tensor([1, T], dtype=torch.int32, device=device)
        query_start_loc = torch.arange(0, 2 * T + 1, T, dtype=torch.int32, device=device)
        h = state[blocks[[0, 1], [0, T - 1]].long()].double()  # the blocks num_accepted - 1 it must start from
        out = torch.full(inputs.x.shape, math.nan, device=device)  # fp32: the check is not blurred by bf16 rounding

        def error() -> float:
            outputs, final = [], h.clone()
            for t in range(T):  # token t of both rows
                token = inputs.rows(query_start_loc[:-1].long() + t)
                outputs.append(recurrence_step_fp64(
                    final, token.x, token.dt, layer.A, token.B, token.C, D=layer.D, dt_bias=layer.dt_bias
                ))  # fmt: skip
            expected = torch.stack(outputs, dim=1).flatten(0, 1)  # [2T, H, P] in token order
            return max(relative_error(out, expected), relative_error(state[blocks[:, -1].long()], final))

        call = lambda: self.verify(state, inputs, layer, blocks, accepted, query_start_loc, out)  # noqa: E731
        return probe_problem(f"{self.note} (speculative call)", call, error)


def _probe_inputs(plan: Plan, device: str, tokens: int) -> tuple[LayerParams, StepInputs]:
    """A random layer and ``tokens`` rows of inputs for a baseline probe, seeded alike for every probe."""
    import torch

    from replayssm_patch.kernels.synthetic import LayerParams, StepInputs

    gen = torch.Generator(device).manual_seed(0)
    layer = LayerParams.random(plan.nheads, gen, device)
    inputs = StepInputs.random(
        tokens, plan.nheads, plan.head_dim, plan.ngroups, plan.d_state, layer, gen, torch.bfloat16
    )
    return layer, inputs


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
    configs: dict[str, tuple[int, int, int] | None] = {"fp32": None, "split": None}
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


def tuned_launch_file(timing: dict[str, Any]) -> dict[str, Any]:
    """The sweep's winners in the format ``REPLAYSSM_LAUNCH_CONFIG`` reads (kernels/launch_config.py)."""
    keys = ("block_p", "block_n", "num_warps")
    return {"replay_step": {mode: dict(zip(keys, cfg, strict=True)) for mode, cfg in timing["configs"].items() if cfg}}


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
    def step(
        self, mode: str, cfg: tuple[int, int, int] | None, write_pos: torch.Tensor, flush_len: torch.Tensor
    ) -> Callable[[], Any]:
        """The decode step as vLLM runs it, in one graph: coefficients, replay, and the fold over the flush rows,
        listed once beforehand as the builder's cursor plan lists them (not timed: one plan serves every layer)."""
        from replayssm_patch.kernels import replay_decode_step
        from replayssm_patch.kernels.decode_fold import flush_work_list

        cache, s, layer = self.caches[mode], self.inputs, self.layer
        tuning = {} if cfg is None else {"block_p": cfg[0], "block_n": cfg[1], "num_warps": cfg[2]}
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
        found: dict[str, Any] = {}
        for mode in ("fp32", "split"):
            timings = {}
            for cfg in self.plan.step_configs:
                call = self.step(mode, cfg, self.write_pos, self.flush_staggered)
                try:
                    timings["x".join(map(str, cfg))] = seconds_per_call(call, self.plan, self.device) * 1e6
                except Exception as exc:  # a config the compiler rejects must not end the sweep
                    print(f"[kernel_bench]   sweep {mode} {cfg} failed: {exc!r}", flush=True)
            best = min(timings, key=timings.__getitem__)
            found[mode] = {"us": timings, "best": tuple(int(v) for v in best.split("x"))}
            print(f"[kernel_bench]   sweep step {mode}: best {best} ({timings[best]:.1f} us)", flush=True)
        return found

    def table(self, baseline: Baseline, configs: dict[str, tuple[int, int, int] | None]) -> list[dict[str, Any]]:
        L, model = self.plan.buffer_len, TrafficModel(self.plan, self.batch)
        timed = TimedCalls("kernel_bench", self.plan, self.device, self.batch)
        measure = timed.measure
        if baseline.fn is not None:
            measure("baseline fp32 state", self.baseline(baseline, "fp32"), model.baseline(4))
            measure("baseline bf16 state", self.baseline(baseline, "bf16"), model.baseline(2))
        for mode, state_bytes in (("fp32", 4), ("split", 2)):
            copy, cfg = (2 if mode == "split" else 0), configs[mode]
            replay = model.replay(state_bytes)
            measure(f"replay {mode} (no row flushing)", self.step(mode, cfg, self.write_pos, self.flush_none), replay)
            staggered = self.step(mode, cfg, self.write_pos, self.flush_staggered)
            measure(
                f"decode step {mode} (1/L rows flushing)", staggered, replay + model.fold(1.0 / L, state_bytes, copy)
            )
            aligned = self.step(mode, cfg, self.aligned_pos, self.flush_all)
            measure(f"decode step {mode} (all rows flushing)", aligned, model.aligned(copy))
            measure(f"materialise flush {mode} (all rows)", self.materialise(mode), model.flush(1.0, copy))
        return timed.rows("baseline fp32 state")


# ---------------------------------------------------------------------------------------------------- verify


def run_verify(plan: Plan, device: str, baseline: Baseline) -> dict[str, Any]:
    """Time the speculative verify step, its two parts, and vLLM's speculative update at every batch."""
    problem = baseline.verify_problem(plan, device)
    result: dict[str, Any] = {
        "method": timing_method(device),
        "tokens_per_row": VERIFY_TOKENS,
        "acceptance_length": ACCEPTANCE_LENGTH,
        "ring_len": plan.buffer_len + VERIFY_TOKENS,
        "baseline": f"none, ReplaySSM timed alone: {problem}"
        if problem
        else f"{baseline.note}: {VERIFY_BASELINE_CALL}",
        "cursors": {},
        "rows": [],
    }
    for batch in plan.batches:
        print(f"[kernel_bench]   verify batch {batch}", flush=True)
        setup = VerifySetup(plan, device, batch)
        result["cursors"][str(batch)] = setup.cursors()
        result["rows"].extend(setup.table(baseline if problem is None else None))
    result["registers"] = compiled_registers(_verify_kernels())
    return result


VERIFY_BASELINE_ROW = "vllm spec verify (fp32 state, 1+k blocks)"
VERIFY_BASELINE_CALL = (
    "selective_state_update(state, x, dt, A, B, C, D, dt_bias, dt_softplus=True, state_batch_indices=blocks, "
    "dst_state_batch_indices=blocks, null_block_id=-1, out=out, num_accepted_tokens=num_accepted, "
    "cu_seqlens=query_start_loc) with blocks int32 [batch, 1+k], x / dt / B / C / out [batch * (1+k), ...]"
)


def _verify_kernels() -> tuple[Any, ...]:
    """The kernels of the verify step whose registers the verify section reports (the fold is the flush kernel)."""
    from replayssm_patch.kernels.flush import _flush_kernel
    from replayssm_patch.kernels.verify import _verify_coefficients_kernel, _verify_step_kernel

    return _verify_coefficients_kernel, _verify_step_kernel, _flush_kernel


class VerifySetup:
    """One batch's speculative verify: T = 1 + k query tokens per row on paged caches with rings of L + T entries
    (the plugin's verify layout), slots scattered as in ``KernelSetup``, and vLLM's 1+k state blocks per request.

    Cursors sit at the steady state of acceptance length AL: row r verified its last T tokens at position
    AL * (r mod ceil(L / AL)) and AL of them were accepted, so the builder's own plan (``plan_verify_rows``)
    commits them and folds the rows whose history would overflow the ring, about 1 in ceil(L / AL)."""

    def __init__(self, plan: Plan, device: str, batch: int) -> None:
        import torch

        from replayssm_patch.kernels import plan_verify_rows_reference
        from replayssm_patch.kernels.synthetic import LayerParams, StepInputs

        self.plan, self.device, self.batch = plan, device, batch
        T, L, AL = VERIFY_TOKENS, plan.buffer_len, ACCEPTANCE_LENGTH
        gen = torch.Generator(device).manual_seed(batch)
        self.layer = LayerParams.random(plan.nheads, gen, device)
        self.inputs = StepInputs.random(
            batch * T, plan.nheads, plan.head_dim, plan.ngroups, plan.d_state, self.layer, gen, torch.bfloat16
        )
        pool = 4 * batch + 1
        self.indices = scattered_slots(pool, batch, gen)
        self.caches = filled_caches(plan, pool, self.indices, gen, SPEC_TOKENS)
        int32 = {"dtype": torch.int32, "device": device}
        self.query_start_loc = torch.arange(0, batch * T + 1, T, **int32)
        self.num_accepted = torch.full((batch,), AL, **int32)
        last_write = torch.zeros(pool, **int32)
        last_write[self.indices.long()] = AL * (torch.arange(batch, **int32) % math.ceil(L / AL))
        self.write_pos, self.fold_len = torch.zeros(batch, **int32), torch.zeros(batch, **int32)
        plan_verify_rows_reference(
            self.indices, self.query_start_loc, self.num_accepted, last_write, torch.full((pool,), T, **int32),
            torch.full((pool,), L - 1, **int32), self.write_pos, self.fold_len, batch, L, T, PAD,
        )  # fmt: skip
        self.out = torch.empty(batch * T, plan.nheads, plan.head_dim, dtype=torch.bfloat16, device=device)
        blocks = 4 * batch * T + 1
        self.base_state = paged_tensors(
            stock_shapes(plan, SPEC_TOKENS), (torch.bfloat16, torch.float32), blocks, device
        )[1]
        self.base_state.normal_(generator=gen)
        self.blocks = scattered_slots(blocks, batch * T, gen).view(batch, T)

    def cursors(self) -> dict[str, Any]:
        folding = int((self.fold_len > 0).sum())
        return {
            "rows_folding": folding,
            "mean_fold_len": float(self.fold_len.sum()) / max(folding, 1),
            "mean_history": float(self.write_pos.float().mean()),
        }

    def step(self, mode: str, fold_len: torch.Tensor | None = None) -> Callable[[], Any]:
        """``replay_verify_step`` (fold launch, coefficients, outputs); with ``fold_len`` None only the verify
        (``replay_verify``, no fold launch)."""
        from replayssm_patch.kernels import replay_verify, replay_verify_step

        cache, s, layer = self.caches[mode], self.inputs, self.layer
        common = (self.query_start_loc, VERIFY_TOKENS)
        kwargs = {"D": layer.D, "dt_bias": layer.dt_bias, "out": self.out}
        ring = (cache.ring_x, cache.ring_B, cache.ring_dt, self.indices, self.write_pos)
        if fold_len is None:
            read = cache.state_bf16 if cache.state_bf16 is not None else cache.ssm_state
            return lambda: replay_verify(s.x, s.dt, layer.A, s.B, s.C, read, *ring, *common, **kwargs)
        return lambda: replay_verify_step(
            s.x, s.dt, layer.A, s.B, s.C, cache.ssm_state, *ring, fold_len, *common, state_bf16=cache.state_bf16,
            **kwargs,
        )  # fmt: skip

    def table(self, baseline: Baseline | None) -> list[dict[str, Any]]:
        model, T = TrafficModel(self.plan, self.batch), VERIFY_TOKENS
        timed = TimedCalls("kernel_bench", self.plan, self.device, self.batch)
        if baseline is not None:
            call = lambda: baseline.verify(  # noqa: E731
                self.base_state, self.inputs, self.layer, self.blocks, self.num_accepted, self.query_start_loc, self.out
            )
            timed.measure(VERIFY_BASELINE_ROW, call, model.baseline(4, T))
        cursors = self.cursors()
        share = cursors["rows_folding"] / self.batch
        for mode, state_bytes in (("fp32", 4), ("split", 2)):
            verify = model.verify(state_bytes, T, cursors["mean_history"])
            fold = model.flush(share, 2 if mode == "split" else 0, cursors["mean_fold_len"])
            timed.measure(f"verify step {mode} (fold + verify)", self.step(mode, self.fold_len), verify + fold)
            timed.measure(f"verify {mode} (no row folding)", self.step(mode), verify)
            timed.measure(f"fold launch {mode}", flush_call(self.caches[mode], self.layer.A, self.indices,
                                                            self.fold_len), fold)  # fmt: skip
        return timed.rows(VERIFY_BASELINE_ROW)


def scattered_slots(pool: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """``count`` distinct int32 slots drawn from 1..pool-1 (a server's live slots are never 0..B-1)."""
    import torch

    return (torch.randperm(pool - 1, generator=gen, device=gen.device)[:count] + 1).to(torch.int32)


def filled_caches(
    plan: Plan, pool: int, indices: torch.Tensor, gen: torch.Generator, spec_tokens: int = 0
) -> dict[str, ReplayCache]:
    """Paged fp32 and split-precision caches of ``pool`` slots, random checkpoints in ``indices`` and random
    rings (dt as softplus(U[-5, 0]), as the synthetic layers draw it)."""
    import torch

    from replayssm_patch.kernels.common import softplus_reference

    caches = {}
    for mode, split in (("fp32", False), ("split", True)):
        cache = paged_cache(plan, pool, split, str(gen.device), spec_tokens)
        shape = (indices.shape[0], plan.nheads, plan.head_dim, plan.d_state)
        cache.set_checkpoint(indices, torch.randn(shape, generator=gen, device=gen.device))
        cache.ring_x.normal_(generator=gen)
        cache.ring_B.normal_(generator=gen)
        cache.ring_dt.copy_(
            softplus_reference(torch.rand(cache.ring_dt.shape, generator=gen, device=gen.device) * 5 - 5)
        )
        caches[mode] = cache
    return caches


def flush_call(cache: ReplayCache, A: torch.Tensor, indices: torch.Tensor, lengths: torch.Tensor) -> Callable[[], Any]:
    """The standalone flush launch over every row, folding the first ``lengths`` ring entries of each."""
    from replayssm_patch.kernels import flush_ring

    return lambda: flush_ring(
        cache.ssm_state, cache.ring_x, cache.ring_B, cache.ring_dt, A, indices, lengths, state_bf16=cache.state_bf16
    )


def stock_shapes(plan: Plan, spec_tokens: int = 0) -> tuple[tuple[int, ...], ...]:
    """vLLM's own (conv, ssm) state shapes of a Mamba-2 layer, the conv window widened by k under speculation."""
    conv_dim = plan.nheads * plan.head_dim + 2 * plan.ngroups * plan.d_state
    return (conv_dim, CONV_WIDTH - 1 + spec_tokens), (plan.nheads, plan.head_dim, plan.d_state)


def paged_cache(plan: Plan, slots: int, split: bool, device: str, spec_tokens: int = 0) -> ReplayCache:
    """A ReplayCache whose tensors are views into one page per slot, laid out by the plugin's own MambaSpec
    functions (conv state, checkpoint, ring, bf16 copy), as vLLM packs them; with ``spec_tokens`` = k the
    speculative layout (rings of buffer_len + 1 + k entries, conv widened)."""
    import torch

    from replayssm_patch.config import ReplaySSMConfig
    from replayssm_patch.kernels import ReplayCache
    from replayssm_patch.state_layout import (
        RING_B,
        RING_DT,
        RING_X,
        STATE_BF16,
        replay_state_dtypes,
        replay_state_shapes,
    )

    knobs = ReplaySSMConfig(enable=True, buffer_len=plan.buffer_len, split_precision=split)
    verify_len = 1 + spec_tokens if spec_tokens else 0
    shapes = replay_state_shapes(stock_shapes(plan, spec_tokens), knobs, dim_first=True, verify_len=verify_len)
    dtypes = replay_state_dtypes((torch.bfloat16, torch.float32), torch.bfloat16, knobs)
    tensors = paged_tensors(shapes, dtypes, slots, device)
    copy = tensors[STATE_BF16] if split else None
    return ReplayCache(tensors[1], tensors[RING_X], tensors[RING_B], tensors[RING_DT], copy)


@dataclass(frozen=True)
class TrafficModel:
    """Bytes each kernel must move from/to HBM (bf16 activations and ring, fp32 ring dt; the verify's coefficient
    scratch, ~3% of a row's fp32 state, is left out)."""

    plan: Plan
    batch: int

    @property
    def _state_elems(self) -> int:
        return self.batch * self.plan.nheads * self.plan.head_dim * self.plan.d_state

    @property
    def _entry_bytes(self) -> int:  # one ring entry of one sequence: x, B (per group) and dt
        p = self.plan
        return p.nheads * p.head_dim * 2 + p.ngroups * p.d_state * 2 + p.nheads * 4

    @property
    def _io_bytes(self) -> int:  # x in, y out, B and C in, dt in
        p = self.plan
        return self.batch * (2 * p.nheads * p.head_dim * 2 + 2 * p.ngroups * p.d_state * 2 + p.nheads * 4)

    def baseline(self, state_bytes: int, tokens: int = 1) -> float:
        """vLLM's update of ``tokens`` tokens per row: the state read once and written after every token (the
        speculative path keeps one state block per query token)."""
        return tokens * self._io_bytes + (1 + tokens) * self._state_elems * state_bytes

    def replay(self, state_bytes: int) -> float:
        return self.verify(state_bytes, 1, (self.plan.buffer_len - 1) / 2)  # staggered cursors: (L-1)/2 earlier

    def verify(self, state_bytes: int, tokens: int, history: float) -> float:
        """``tokens`` outputs per row from one checkpoint read: ``history`` ring entries read (a mean over rows),
        the tokens' entries appended."""
        ring = self.batch * (history + tokens) * self._entry_bytes
        return tokens * self._io_bytes + self._state_elems * state_bytes + ring

    def flush(self, share: float, copy_bytes: int, entries: float | None = None) -> float:
        """``share`` of the rows folding ``entries`` ring entries each (default the whole decode ring)."""
        ring = self.batch * (self.plan.buffer_len if entries is None else entries) * self._entry_bytes
        return share * (ring + self._state_elems * (4 + 4 + copy_bytes))

    def fold(self, share: float, read_bytes: int, copy_bytes: int) -> float:
        """What flushing rows add to a replay: master read (if the replay read the bf16 copy) and write, the copy,
        their B entries (the x entries are read by the replay anyway)."""
        p = self.plan
        extra_read = 4 - read_bytes
        ring_B = self.batch * p.buffer_len * p.ngroups * p.d_state * 2
        return share * (self._state_elems * (extra_read + 4 + copy_bytes) + ring_B)

    def aligned(self, copy_bytes: int) -> float:
        """Every row at write_pos L-1, all flushing: full rings read, master read and written (+ the copy)."""
        return (
            self._io_bytes
            + self.batch * self.plan.buffer_len * self._entry_bytes
            + self._state_elems * (4 + 4 + copy_bytes)
        )


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
    for mode, found in timing.get("sweep", {}).items():
        shapes = ", ".join(f"{cfg} {us:.1f}" for cfg, us in sorted(found["us"].items(), key=lambda kv: kv[1]))
        lines += [f"Sweep, decode step {mode} (block_p x block_n x warps: us): {shapes}.", ""]
    return lines + registers_table(timing.get("registers", []))


def _verify_markdown(verify: dict[str, Any]) -> list[str]:
    cursors = "; ".join(
        f"batch {batch}: {c['rows_folding']} of {batch} rows fold {c['mean_fold_len']:.0f} entries, mean history "
        f"{c['mean_history']:.1f}"
        for batch, c in verify["cursors"].items()
    )
    return [
        f"Method: {verify['method']}. T = 1 + k = {verify['tokens_per_row']} query tokens per row, rings of "
        f"L + T = {verify['ring_len']} entries, cursors at the steady state of acceptance length "
        f"{verify['acceptance_length']} ({cursors}).",
        f"Baseline: {verify['baseline']}.",
        "",
        *timing_table(verify["rows"]),
        "",
        *registers_table(verify.get("registers", [])),
    ]


def render_markdown(data: dict[str, Any]) -> str:
    return "\n".join([
        *report_head("ReplaySSM kernel benchmark", data.get("meta", {})),
        *section_markdown(data, "equivalence", "Layer-level equivalence", _equivalence_markdown),
        *section_markdown(data, "timing", "Kernel timing", _timing_markdown),
        *section_markdown(data, "verify", "Speculative verify timing", _verify_markdown),
    ])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
