"""Speculative verify timing of the ReplaySSM kernels against vLLM's speculative selective_state_update.

Section (c) of ``kernel_bench`` (whose docstring describes it), kept apart from the decode sections: the verify
problem (T = 1 + k query tokens per row, cursors at the acceptance length's steady state), vLLM's speculative
baseline call and its probe, the rows and the section's Markdown.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from replayssm_patch.gpu.bench_common import (
    TimedCalls,
    compiled_registers,
    paged_tensors,
    probe_problem,
    registers_table,
    timing_method,
    timing_table,
)
from replayssm_patch.gpu.mamba_bench_setup import (
    FOLD_KNOBS,
    PAD,
    Baseline,
    Plan,
    Shape,
    TrafficModel,
    coef_tuning_of,
    filled_caches,
    flush_call,
    fold_tuning_of,
    probe_inputs,
    scattered_slots,
    stock_shapes,
    sweep_markdown,
    sweep_shapes,
    tuning_of,
)
from replayssm_patch.gpu.variants import ACCEPTANCE_LENGTH, SPEC_TOKENS

if TYPE_CHECKING:  # torch and the kernels are imported lazily: TRITON_INTERPRET must be decided first
    import torch

    from replayssm_patch.kernels import ReplayCache
    from replayssm_patch.kernels.synthetic import LayerParams, StepInputs

VERIFY_TOKENS = 1 + SPEC_TOKENS  # T, the query tokens of a verify row
# what the parts of a swept shape's name are (mamba_bench_setup.Shape)
VERIFY_SHAPE = "block_p x block_n x warps[ x maxnreg[ x mma_stages[ x mma_ring[ x pdl[ x heads[ x tma]]]]]]"
FOLD_SHAPE = "block_p x warps x prefetch[ x maxnreg[ x programs per SM[ x d_state block]]]"
COEF_SHAPE = "heads per program x warps"
ACCEPTED_TOKENS = int(ACCEPTANCE_LENGTH)  # tokens every verify commits: the engine runs' mean length, whole


def run_verify(plan: Plan, device: str, baseline: Baseline, sweep: bool = True) -> dict[str, Any]:
    """Time the speculative verify step, its two parts, and vLLM's speculative update at every batch, with the
    verify's own fastest launch shapes (swept at the largest batch: its T x P accumulators and [L + T, P] ring tile
    are not the decode step's working set, so the decode step's best need not be the verify's)."""
    import torch

    problem = verify_problem(baseline, plan, device)
    result: dict[str, Any] = {
        "method": timing_method(device),
        "tokens_per_row": VERIFY_TOKENS,
        "acceptance_length": ACCEPTED_TOKENS,
        "ring_len": plan.buffer_len + VERIFY_TOKENS,
        "baseline": f"none, ReplaySSM timed alone: {problem}"
        if problem
        else f"{baseline.note}: {VERIFY_BASELINE_CALL}",
        "cursors": {},
        "rows": [],
    }
    configs: dict[str, Any] = {"fp32": None, "split": None}
    folds: dict[str, Any] = dict(configs)
    largest = VerifySetup(plan, device, max(plan.batches))  # swept here, timed below: built once
    if sweep:  # the coefficient launch first: the whole verify's sweep and every row below run its winner
        result["coef_sweep"] = largest.coef_sweep()
        largest.coef_configs = {mode: result["coef_sweep"][mode]["best"] for mode in configs}
        result["sweep"] = largest.sweep()
        configs = {mode: result["sweep"][mode]["best"] for mode in configs}
        result["fold_sweep"] = largest.fold_sweep()
        folds = {mode: result["fold_sweep"][mode]["best"] for mode in folds}
        # without the list, where the prefetch does not spill (session 22: listed 131.7 µs at 256 without the
        # prefetch; session 21, a program per row with it, 119.4 on another host): whether the list pays
        result["fold_sweep_per_row"] = largest.fold_sweep(listed=False)
    result["configs"], result["fold_configs"], result["coef_configs"] = configs, folds, largest.coef_configs
    for batch in plan.batches:
        print(f"[kernel_bench]   verify batch {batch}", flush=True)
        setup = largest if batch == largest.batch else VerifySetup(plan, device, batch, coefs=largest.coef_configs)
        result["cursors"][str(batch)] = setup.cursors
        result["rows"].extend(setup.table(baseline if problem is None else None, configs, folds))
    long_ring = dataclasses.replace(plan, buffer_len=plan.verify_long_ring)
    for batch in plan.batches[-2:]:  # the ring length as a knob: fewer folds against a longer history to replay
        print(f"[kernel_bench]   verify batch {batch}, L = {long_ring.buffer_len}", flush=True)
        setup = VerifySetup(long_ring, device, batch, coefs=largest.coef_configs)
        result["cursors"][f"{batch}, L = {long_ring.buffer_len}"] = setup.cursors
        # at issue 17's batch (128), the same step over the engine's footprint too
        result["rows"].extend(setup.table(baseline if problem is None else None, configs, folds,
                                          f", L = {long_ring.buffer_len}", with_baseline=False,
                                          with_rotation=batch == plan.batches[-2:][0]))  # fmt: skip
    for tokens in plan.verify_token_sweep:  # what the T-token products cost beside the checkpoint read they share
        name = f"verify batch {largest.batch}, T = {tokens}"
        print(f"[kernel_bench]   {name}", flush=True)
        try:  # T = 8 at 256 needs ~34 GB more: an 80-GB H100 (session 31) lost the whole section, sweeps and all
            setup = VerifySetup(plan, device, largest.batch, tokens, coefs=largest.coef_configs)
            rows = setup.table(baseline if problem is None else None, configs, folds, f", T = {tokens}")
        except torch.cuda.OutOfMemoryError:
            left_out(name)
            continue
        result["cursors"][f"{largest.batch}, T = {tokens}"] = setup.cursors
        result["rows"].extend(rows)
    result["registers"] = compiled_registers(_verify_kernels())
    return result


def left_out(name: str) -> None:
    """Say that a row did not fit in this GPU's memory (the section goes on without it)."""
    print(f"[kernel_bench]   {name}: no room on the GPU, left out", flush=True)


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
    (the plugin's verify layout), slots scattered as in the decode timing, and vLLM's 1+k state blocks per request.

    Cursors sit at the steady state of acceptance length AL: row r verified its last T tokens at position
    AL * (r mod ceil(L / AL)) and AL of them were accepted, so the builder's own plan (``plan_verify_rows``)
    commits them and folds the rows whose history would overflow the ring, about 1 in ceil(L / AL). ``tokens``: T
    (default MTP k = 3's 4; AL is then at most T). ``coefs``: the coefficient launch's shape per mode (None: the
    launch table's)."""

    def __init__(
        self, plan: Plan, device: str, batch: int, tokens: int = VERIFY_TOKENS,
        coefs: dict[str, Shape | None] | None = None,
    ) -> None:  # fmt: skip
        import torch

        from replayssm_patch.kernels import plan_verify_rows_reference
        from replayssm_patch.kernels.synthetic import LayerParams, StepInputs

        self.plan, self.device, self.batch, self.tokens = plan, device, batch, tokens
        self.coef_configs: dict[str, Shape | None] = coefs or {"fp32": None, "split": None}
        T, L, AL = tokens, plan.buffer_len, min(ACCEPTED_TOKENS, tokens)
        gen = torch.Generator(device).manual_seed(batch)
        self.layer = LayerParams.random(plan.nheads, gen, device)
        self.inputs = StepInputs.random(
            batch * T, plan.nheads, plan.head_dim, plan.ngroups, plan.d_state, self.layer, gen, torch.bfloat16
        )
        pool = 4 * batch + 1
        self.indices = scattered_slots(pool, batch, gen)
        self.caches = filled_caches(plan, pool, self.indices, gen, T - 1)
        int32 = {"dtype": torch.int32, "device": device}
        self.query_start_loc = torch.arange(0, batch * T + 1, T, **int32)
        self.num_accepted = torch.full((batch,), AL, **int32)
        last_write = torch.zeros(pool, **int32)
        last_write[self.indices.long()] = AL * (torch.arange(batch, **int32) % math.ceil(L / AL))
        self.write_pos, self.fold_len, fold_rows = torch.zeros(3, batch, **int32)
        self.fold_list = (fold_rows, torch.zeros(1, **int32))  # the folding rows, as the plugin's plan lists them
        plan_verify_rows_reference(
            self.indices, self.query_start_loc, self.num_accepted, last_write, torch.full((pool,), T, **int32),
            torch.full((pool,), L - 1, **int32), self.write_pos, self.fold_len, batch, L, T, PAD, *self.fold_list,
        )  # fmt: skip
        self.out = torch.empty(batch * T, plan.nheads, plan.head_dim, dtype=torch.bfloat16, device=device)
        blocks = 4 * batch * T + 1
        self.base_state = paged_tensors(stock_shapes(plan, T - 1), (torch.bfloat16, torch.float32), blocks, device)[1]
        self.base_state.normal_(generator=gen)
        self.blocks = scattered_slots(blocks, batch * T, gen).view(batch, T)

    @functools.cached_property
    def cursors(self) -> dict[str, Any]:
        """Folding rows, their mean fold length and the mean history of the cursors ``__init__`` planned (fixed for
        the setup's life, so read from the device once)."""
        folding = int((self.fold_len > 0).sum())
        return {
            "rows_folding": folding,
            "mean_fold_len": float(self.fold_len.sum()) / max(folding, 1),
            "mean_history": float(self.write_pos.float().mean()),
        }

    def step(
        self, mode: str, fold_len: torch.Tensor | None = None, cfg: Shape | None = None, fold_cfg: Shape | None = None,
        cache: ReplayCache | None = None,
    ) -> Callable[[], Any]:  # fmt: skip
        """``replay_verify_step`` (fold launch, coefficients, outputs); with ``fold_len`` None only the verify
        (``replay_verify``, no fold launch); ``cfg`` the verify launch's shape and ``fold_cfg`` the fold's (None: the
        launch table's); ``cache`` another layer's caches of the mode (None: this setup's)."""
        from replayssm_patch.kernels import replay_verify, replay_verify_step

        cache, s, layer = cache or self.caches[mode], self.inputs, self.layer
        common = (self.query_start_loc, self.tokens)
        kwargs = {"D": layer.D, "dt_bias": layer.dt_bias, "out": self.out, **tuning_of(cfg),
                  **coef_tuning_of(self.coef_configs[mode])}  # fmt: skip
        ring = (cache.ring_x, cache.ring_B, cache.ring_dt, self.indices, self.write_pos)
        if fold_len is None:
            read = cache.state_bf16 if cache.state_bf16 is not None else cache.ssm_state
            return lambda: replay_verify(s.x, s.dt, layer.A, s.B, s.C, read, *ring, *common, **kwargs)
        return lambda: replay_verify_step(
            s.x, s.dt, layer.A, s.B, s.C, cache.ssm_state, *ring, fold_len, *common, state_bf16=cache.state_bf16,
            fold_list=self.fold_list, fold_launch=fold_tuning_of(fold_cfg), **kwargs,
        )  # fmt: skip

    def coefficients(self, mode: str, cfg: Shape | None = None) -> Callable[[], Any]:
        """The verify's first launch alone (``verify_coefficients``), to split the verify's time between its two;
        ``cfg`` its (heads per program, num_warps), None: this setup's."""
        from replayssm_patch.kernels.layout import per_head, per_head_dt
        from replayssm_patch.kernels.verify import verify_coefficients

        cache, s, layer = self.caches[mode], self.inputs, self.layer
        nheads = s.x.shape[1]
        dt, A, dt_bias = per_head_dt(s.dt), per_head(layer.A, nheads), per_head(layer.dt_bias, nheads)
        heads, warps = cfg or self.coef_configs[mode] or (0, 0)
        return lambda: verify_coefficients(
            dt, A, s.B, s.C, cache.ring_B, cache.ring_dt, self.indices, self.write_pos, self.query_start_loc,
            self.tokens, dt_bias=dt_bias, dt_softplus=True, pad_slot_id=PAD, heads_per_program=heads,
            num_warps=warps,
        )  # fmt: skip

    def coef_sweep(self) -> dict[str, Any]:
        """Best (heads per program, num_warps) of the coefficient launch alone at this batch's cursors, per mode."""
        return sweep_shapes("verify coefficients", self.coefficients, self.plan, self.device,
                            self.plan.verify_coef_configs)  # fmt: skip

    def sweep(self) -> dict[str, Any]:
        """Best (block_p, block_n, num_warps) of the whole verify step at this batch's cursors, per mode."""
        return sweep_shapes(
            "verify", lambda mode, cfg: self.step(mode, self.fold_len, cfg), self.plan, self.device,
            self.plan.verify_configs,
        )  # fmt: skip

    def fold(self, mode: str, cfg: Shape | None, listed: bool = True) -> Callable[[], Any]:
        """The fold launch alone at this batch's cursors (``cfg``: its shape, None: the launch table's), walking the
        plan's list of folding rows as the plugin does, or (``listed`` False) with a program per (row, head)."""
        work_list = self.fold_list if listed else None
        return flush_call(self.caches[mode], self.layer.A, self.indices, self.fold_len, cfg, work_list)

    def fold_sweep(self, listed: bool = True) -> dict[str, Any]:
        """Best shape (``FOLD_KNOBS``) of the fold launch at this batch's cursors, per mode, walking the
        plan's list (or, ``listed`` False, a program per (row, head))."""
        label = "verify fold" if listed else "verify fold, a program per row,"
        fold = lambda mode, cfg: self.fold(mode, cfg, listed)  # noqa: E731
        return sweep_shapes(label, fold, self.plan, self.device, self.plan.fold_configs)

    def step_bytes(self, mode: str) -> tuple[float, float]:
        """HBM bytes of the verify (outputs and coefficients) and of its fold at this batch's cursors."""
        model, cursors = TrafficModel(self.plan, self.batch), self.cursors
        verify = model.verify(4 if mode == "fp32" else 2, self.tokens, cursors["mean_history"])
        fold = model.flush(cursors["rows_folding"] / self.batch, 2 if mode == "split" else 0, cursors["mean_fold_len"])
        return verify, fold

    def measure_rotation(self, timed: TimedCalls, configs: dict[str, Any], folds: dict[str, Any]) -> None:
        """The fp32 verify step (fold + verify) of ``plan.rotation_layers`` layers in turn, each on caches of its own
        of ``plan.rotation_pool`` slots, timed per layer into ``timed``: as many distinct pages a step as the engine
        touches (~70 GB at the ring of 28), where the other rows reuse one layer's caches. Why: session 23's engine
        ran the fp32 arms 17-66 % slower than these rows predict; a slower rotation points at the footprint (TLB
        reach, L2), an equal one at the host or the clock. Left out, and said so, where the GPU has no room."""
        import torch

        layers, pool = self.plan.rotation_layers, self.plan.rotation_pool
        name = f"verify step fp32 (fold + verify), {layers} layers' pools of {pool} slots in turn, per layer"
        gen = torch.Generator(self.device).manual_seed(self.batch + 1)
        try:
            caches = [filled_caches(self.plan, pool, self.indices, gen, self.tokens - 1, ("fp32",))["fp32"]
                      for _ in range(layers)]  # fmt: skip
        except torch.cuda.OutOfMemoryError:
            left_out(name)
            return
        steps = [self.step("fp32", self.fold_len, configs["fp32"], folds["fp32"], cache) for cache in caches]
        timed.measure(name, lambda: [step() for step in steps], sum(self.step_bytes("fp32")), per=layers)

    def table(
        self, baseline: Baseline | None, configs: dict[str, Any], folds: dict[str, Any], suffix: str = "",
        with_baseline: bool = True, with_rotation: bool = False,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """Rows of the verify step, its parts and vLLM's call (its speed-ups against that call), each row's name
        ending in ``suffix`` (this setup's ring or T); ``with_baseline`` False leaves vLLM's row out (another ring:
        vLLM's call has none, and its row is the main table's); ``with_rotation`` adds ``measure_rotation``'s row."""
        model, T = TrafficModel(self.plan, self.batch), self.tokens
        timed = TimedCalls("kernel_bench", self.plan, self.device, self.batch)
        baseline_row = VERIFY_BASELINE_ROW + suffix
        if baseline is not None:
            call = lambda: verify_call(  # noqa: E731
                baseline, self.base_state, self.inputs, self.layer, self.blocks, self.num_accepted,
                self.query_start_loc, self.out,
            )  # fmt: skip
            timed.measure(baseline_row, call, model.baseline(4, T))
        cursors = self.cursors
        for mode in ("fp32", "split"):
            verify, fold = self.step_bytes(mode)
            cfg, fold_cfg = configs[mode], folds[mode]
            timed.measure(f"verify step {mode} (fold + verify){suffix}", self.step(mode, self.fold_len, cfg, fold_cfg),
                          verify + fold)  # fmt: skip
            timed.measure(f"verify {mode} (no row folding){suffix}", self.step(mode, None, cfg), verify)
            coefficients = model.verify_coefficients(T, cursors["mean_history"], self.plan.buffer_len + T)
            timed.measure(f"of it the coefficient launch {mode}{suffix}", self.coefficients(mode), coefficients)
            timed.measure(f"fold launch {mode}{suffix}", self.fold(mode, fold_cfg), fold)
            # the same fold with a program for every (row, head), as before the list (session 21): the list's gain
            timed.measure(f"fold launch {mode}, a program per row{suffix}", self.fold(mode, fold_cfg, False), fold)
        if with_rotation:
            self.measure_rotation(timed, configs, folds)
        rows = timed.rows(baseline_row)
        return rows if with_baseline else [row for row in rows if row["kernel"] != baseline_row]


def verify_call(
    baseline: Baseline, state: torch.Tensor, inputs: StepInputs, layer: LayerParams, blocks: torch.Tensor,
    num_accepted: torch.Tensor, query_start_loc: torch.Tensor, out: torch.Tensor,
) -> None:  # fmt: skip
    """One speculative verify as vLLM 0.24's MambaMixer2 runs it: ``blocks`` [batch, 1+k] are each request's
    state blocks (source and destination alike, as without prefix caching), the initial state is read from
    block num_accepted-1 and the state after query token t is written to block t; ``inputs`` hold the
    batch x (1+k) tokens, row r's at query_start_loc[r]..query_start_loc[r+1]-1."""
    baseline.call(
        state, inputs, layer, out, state_batch_indices=blocks, dst_state_batch_indices=blocks,
        num_accepted_tokens=num_accepted, cu_seqlens=query_start_loc,
    )  # fmt: skip


def verify_problem(baseline: Baseline, plan: Plan, device: str) -> str | None:
    """Why the speculative call cannot be the verify timing's baseline, None when it can: a 2-row probe (one
    row accepted 1 token last step, one all T) against the fp64 recurrence over its T tokens, outputs and the
    state written after the last token."""
    if baseline.fn is None:
        return baseline.note
    import torch

    from replayssm_patch.gpu.layer_check import relative_error
    from replayssm_patch.kernels.ground_truth import recurrence_step_fp64

    T = VERIFY_TOKENS
    layer, inputs = probe_inputs(plan, device, 2 * T)
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

    call = lambda: verify_call(baseline, state, inputs, layer, blocks, accepted, query_start_loc, out)  # noqa: E731
    return probe_problem(f"{baseline.note} (speculative call)", call, error)


def verify_markdown(verify: dict[str, Any]) -> list[str]:
    """The verify section's Markdown body (``kernel_bench.render_markdown`` puts it under its heading)."""
    cursors = "; ".join(
        f"batch {batch}: {c['rows_folding']} of {batch} rows fold {c['mean_fold_len']:.0f} entries, mean history "
        f"{c['mean_history']:.1f}"
        for batch, c in verify["cursors"].items()
    )
    return [
        f"Method: {verify['method']}. T = 1 + k = {verify['tokens_per_row']} query tokens per row, rings of "
        f"L + T = {verify['ring_len']} entries, cursors at the steady state of acceptance length "
        f"{verify['acceptance_length']} ({cursors}).",
        f"Baseline: {verify['baseline']}. Launch shapes (block_p, block_n, num_warps): {verify.get('configs')}; "
        f"of the fold ({', '.join(FOLD_KNOBS)}): {verify.get('fold_configs')}; of the coefficient launch "
        f"(heads per program, num_warps; None: the table's): {verify.get('coef_configs')}.",
        "",
        *timing_table(verify["rows"]),
        "",
        *sweep_markdown(verify.get("coef_sweep", {}), "verify coefficient launch", COEF_SHAPE),
        *sweep_markdown(verify.get("sweep", {}), "verify step", VERIFY_SHAPE),
        *sweep_markdown(verify.get("fold_sweep", {}), "verify fold", FOLD_SHAPE),
        *sweep_markdown(verify.get("fold_sweep_per_row", {}), "verify fold, a program per row,", FOLD_SHAPE),
        *registers_table(verify.get("registers", [])),
    ]
