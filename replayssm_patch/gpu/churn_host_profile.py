"""Where the host time of steps under churn goes: churn_step.py's workload, the engine in this process under cProfile.

    python3 -m replayssm_patch.gpu.churn_host_profile --model /tmp/model-qwen35 --variant replayssm_fp32 \
        --mode default --batches 64 --out /tmp/gpu/out/host_profile_churn-h200-qwen3.5-4b.json

Why: on the H200 (2026-12-03, qwen3.5-4b, B = 64 under churn, one host) a step that prefilled beside the decodes took
49.7 ms with ReplaySSM fp32 and 48.3 ms with native_mixed_steps against the baseline's 39.1 ms, with 19-22 ms of
kernels in each and 936-1,071 kernel launches: the extra time is host work that the profiler's CUDA-call tally does
not show. This names it by Python function. Method: the engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0: one
thread runs engine core, scheduler, worker and output processing, see host_profile.py); per batch one churn run
without the profiler (its window gives the in-process step, mixed and decode-only, as churn_step.py reads them),
then one with a cProfile of each measured engine call. A function's cost is its time over those calls per call,
over all of them and by kind ("mixed": the call or the one after it admitted a prompt, as async scheduling launches
the next step; "decode": the rest). cProfile slows Python calls: compare arms, not absolute figures; an arm's extra
is taken over the baseline's scaled by the host's slowdown between the two runs (host_profile.host_slowdown).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from replayssm_patch.gpu.churn_step import (
    OUTPUT_TOKENS,
    ROW_KEY_CHURN,
    Churn,
    ChurnWindow,
    churn_window,
    count_problem,
)
from replayssm_patch.gpu.decode_window import EngineStep
from replayssm_patch.gpu.engine_step import (
    ROW_FACTS,
    command_line,
    engine_batches,
    engine_options,
    engine_problem,
)
from replayssm_patch.gpu.host_profile import (
    AllocatorCounts,
    FunctionCost,
    GcPauses,
    arm_difference,
    baseline_of,
    comparable_functions,
    cost_fields,
    in_process_engine,
    per_step_costs,
    summary_markdown,
)
from replayssm_patch.gpu.row_file import record_row, row_file_problem

STEPS = 256  # measured steps per run: ~85 mixed ones at B = 64 with 192-token outputs
TITLE = "Host time per step under churn"
WHAT = (
    "Host time per step of vLLM 0.24 under churn by function (churn_step.py's workload: B requests decoding, each "
    "finished one replaced by a fresh prompt of prompt_tokens random ids, output_tokens each): the engine in-process "
    "(VLLM_ENABLE_V1_MULTIPROCESSING=0), a cProfile of each of the steps + 1 measured engine calls after "
    "output_tokens warm-up steps; per function its time per call in microseconds, self (tottime) and inclusive "
    "(cumtime), over all calls and, in by_kind, apart for mixed calls (the call or the next admitted a prompt) and "
    "decode-only ones, with their counts. step_ms, mixed_step_ms, decode_step_ms, mixed_share: an unprofiled churn "
    "run before it (churn_step.churn_window); gc_per_step: Python's garbage collections and their pause ms per step "
    "of that run (warm-up included), by generation; allocator_per_step: the CUDA caching allocator's cudaMalloc and "
    "cudaFree calls, free-all-and-retry events and all-stream syncs per step of that run (None without CUDA); "
    "profiled_step_ms: the profiled run's mean step. Written by replayssm_patch/gpu/churn_host_profile.py."
)


WINDOW_FIELDS = {"step_ms": "mean_ms", "mixed_step_ms": "mixed_ms", "decode_step_ms": "decode_ms",
                 "mixed_share": "mixed_share", "mean_rows": "mean_rows"}  # fmt: skip


def window_fields(window: ChurnWindow | None, prefix: str = "") -> dict[str, Any]:
    """A run's steps as row fields, all of them (``prefix``: the mean step alone); None where the run had no engine
    timestamps."""
    names = {"step_ms": "mean_ms"} if prefix else WINDOW_FIELDS
    return {prefix + field: None if window is None else getattr(window, attr) for field, attr in names.items()}


class StepKindProfiles:
    """A cProfile of each measured engine call, summed by kind after the run (so the summing does not land between
    the measured steps).

    Why by kind: decode-only steps replay a CUDA graph and steps with a prefill run eagerly, so their host costs
    differ in kind, and one profile over both shows neither. Under vLLM's async scheduling a call also schedules and
    launches the step after it, so a call counts as "mixed" when it or its successor admitted a prompt, else as
    "decode" (the last call, whose successor is not known, by itself)."""

    def __init__(self) -> None:
        self.profiled: list[tuple[cProfile.Profile, bool]] = []  # each call's profile, and whether it admitted one

    def __call__(self, step: Callable[[], EngineStep]) -> EngineStep:
        profile = cProfile.Profile()
        profile.enable()
        try:
            done = step()
        finally:
            profile.disable()
        self.profiled.append((profile, done.started > 0))
        return done

    def costs(self) -> tuple[list[FunctionCost], dict[str, dict[str, Any]]]:
        """Every call's function costs per call, and each kind's (its calls and the functions to compare arms by)."""
        admitted = [a for _, a in self.profiled]
        kinds = {"mixed": pstats.Stats(), "decode": pstats.Stats()}
        calls = {"mixed": 0, "decode": 0}
        for k, (profile, _) in enumerate(self.profiled):
            kind = "mixed" if admitted[k] or any(admitted[k + 1 : k + 2]) else "decode"
            kinds[kind].add(profile)
            calls[kind] += 1
        by_kind = {kind: {"calls": calls[kind], "functions": comparable_functions(
            per_step_costs({}, kinds[kind].stats, calls[kind]))}  # type: ignore[attr-defined]
            for kind in kinds if calls[kind]}  # fmt: skip
        merged = pstats.Stats()
        merged.add(*kinds.values())
        return per_step_costs({}, merged.stats, len(self.profiled)), by_kind  # type: ignore[attr-defined]


def measure_batch(llm: Any, args: argparse.Namespace, batch: int, vocab: int) -> dict[str, Any]:
    """One unprofiled churn run (also the warm-up of this batch's shapes), then one under cProfile, call by call."""
    rng = np.random.default_rng([args.seed, batch])
    # only the unprofiled run: cProfile slows what allocates, and so the collections
    with GcPauses() as pauses, AllocatorCounts() as allocator:
        plain = churn_window(Churn(llm.llm_engine, args, batch, rng, vocab).run(args.output_tokens, args.steps))
    profiles = StepKindProfiles()
    profiled = churn_window(
        Churn(llm.llm_engine, args, batch, rng, vocab).run(args.output_tokens, args.steps, measure_step=profiles)
    )
    costs, by_kind = profiles.costs()
    return {"variant": args.variant, "mode": args.mode, "batch": batch, "prompt_tokens": args.prompt_tokens,
            "output_tokens": args.output_tokens, "steps": args.steps, **window_fields(plain),
            "gc_per_step": pauses.per_step(args.output_tokens + args.steps),
            "allocator_per_step": allocator.per_step(args.output_tokens + args.steps),
            **window_fields(profiled, "profiled_"), **cost_fields(costs), "by_kind": by_kind}  # fmt: skip


def parser() -> argparse.ArgumentParser:
    p = engine_options(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    p.add_argument("--output-tokens", type=int, default=OUTPUT_TOKENS,
                   help=f"tokens per replacing request [{OUTPUT_TOKENS}]: B / this many prefills per step")  # fmt: skip
    p.add_argument("--steps", type=int, default=STEPS, help=f"measured steps per run [{STEPS}]")
    p.add_argument("--out", type=Path, required=True, help="JSON file to merge the rows into (+ a .md beside it)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    counts = count_problem(args, ("output_tokens", "steps"))
    engine = in_process_engine(args, engine_problem(args) or counts or row_file_problem(args.out, WHAT))
    if isinstance(engine, int):
        return engine
    llm, facts, vocab = engine
    command = command_line("replayssm_patch.gpu.churn_host_profile", argv)
    for batch in engine_batches(llm, args):
        row = measure_batch(llm, args, batch, vocab) | {k: facts[k] for k in ROW_FACTS}
        rows = record_row(args.out, row, WHAT, command, facts, key=ROW_KEY_CHURN)["rows"]
        args.out.with_suffix(".md").write_text(summary_markdown(rows, title=TITLE, what=WHAT))
        print(f"{args.variant} {args.mode} B={batch}: step {row['step_ms']} ms in-process (mixed "
              f"{row['mixed_step_ms']}, decode-only {row['decode_step_ms']}), {row['profiled_step_ms']} ms profiled; "
              f"GC {row['gc_per_step']}; allocator {row['allocator_per_step']}", flush=True)  # fmt: skip
        baseline = None if args.variant == "baseline" else baseline_of(row, rows)
        if baseline is not None:  # the baseline ran first on this host: say at once where the extra time is
            for f in arm_difference(row, baseline, "total_us", 12):
                print(f"  {f['extra_us']:+10.1f} µs  {f['function']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
