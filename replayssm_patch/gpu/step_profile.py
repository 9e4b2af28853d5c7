"""Where a decode step's time goes: vLLM 0.24's torch profiler around a generate, summarised on the GPU host.

    python3 -m replayssm_patch.gpu.step_profile --model MODEL_DIR --variant replayssm_fp32 --mode default \
        --batches 64,256 --out DIR

The engine is engine_step.py's (same options and defaults) with `profiler_config` profiler=torch (no stacks, no
shapes). For each batch B: a warm-up generate, then `LLM.start_profile()`, one generate of B prompts of 1024
random token ids long enough for --steps pure decode steps at batch B after the chunked prefill, and
`LLM.stop_profile()`. The worker's trace is summarised by trace_summary.py over the last --steps decode steps
(default 16 = the ring length, so every row's flush is inside) into DIR/step_profile.json (rows merged by
variant, mode, batch) and DIR/step_profile.md; the trace (tens of MB) is deleted unless --keep-traces.

With --step-batches and --steps-out the same engine first measures engine_step.py's rows at those batches (its
method, --repeats of them) into --steps-out: one start-up (~200 s of an H200 session's 30 minutes) serves both.
The torch profiler is configured but idle until start_profile, and CUDA graphs are captured at both lists'
batches; such rows say so (profiler_configured).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from replayssm_patch.gpu.engine_step import (
    REPEATS,
    SHORT_TOKENS,
    command_line,
    engine_batches,
    engine_options,
    engine_problem,
    measure_rows,
    out_problem,
    parse_engine_batches,
    prompt_token_ids,
    start_engine,
    timed_generate,
)
from replayssm_patch.gpu.engine_step import WHAT as STEP_WHAT
from replayssm_patch.gpu.row_file import ROW_KEY, read_row_file, record_row
from replayssm_patch.gpu.trace_summary import TraceError, markdown, summarise_trace

STEPS = 16
SLACK_STEPS = 8  # beyond the estimate: decode tokens share the prefill budget, and the last steps need a successor
WHAT = (
    "Kernel time per decode step by layer kind (torch profiler through vLLM's profiler_config; "
    "replayssm_patch/gpu/step_profile.py and trace_summary.py): microseconds per step, averaged over the "
    "profiled pure decode steps at the row's batch."
)
TRACE_GLOB = "*.pt.trace.json*"


def profiler_config(trace_dir: Path) -> dict[str, Any]:
    """vLLM 0.24 ProfilerConfig fields: torch profiler, light traces (no stacks, shapes or printed tables)."""
    return {
        "profiler": "torch",
        "torch_profiler_dir": str(trace_dir.resolve()),
        "torch_profiler_with_stack": False,
        "torch_profiler_record_shapes": False,
        "torch_profiler_dump_cuda_time_total": False,
        "torch_profiler_use_gzip": True,
    }


def profiled_tokens(
    batch: int, max_num_batched_tokens: int, steps: int, prompt_tokens: int, tokens_per_step: float = 1.0
) -> int:
    """Output tokens per request so that at least `steps` full-batch decode steps follow the chunked prefill; a
    speculative step emits about its acceptance length (``tokens_per_step``) per request."""
    prefill_steps = math.ceil(batch * prompt_tokens / max_num_batched_tokens)
    return prefill_steps + math.ceil((steps + SLACK_STEPS) * tokens_per_step)


def newest_trace(trace_dir: Path, before: set[Path]) -> Path | None:
    """The newest trace not among ``before`` (the traces there before profiling): by name, not by mtime, whose
    coarse granularity can date a trace written right after the profile started before its start."""
    found = [p for p in trace_dir.glob(TRACE_GLOB) if p not in before]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def parser() -> argparse.ArgumentParser:
    p = engine_options(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    p.add_argument("--steps", type=int, default=STEPS, help="decode steps summarised per batch [16, one ring]")
    p.add_argument("--out", type=Path, required=True, help="dir for step_profile.json / .md (and traces/)")
    p.add_argument("--keep-traces", action="store_true", help="keep the raw traces in DIR/traces")
    p.add_argument("--step-batches", type=parse_engine_batches, default=None,
                   help="first measure engine_step's rows at these batches, in the same engine")  # fmt: skip
    p.add_argument("--steps-out", type=Path, default=None, help="engine_step's results file for --step-batches")
    p.add_argument("--repeats", type=int, default=REPEATS, help=f"engine_step's repeats per batch [{REPEATS}]")
    return p


def steps_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the engine-step part of a run, or None (also when it has none)."""
    if (args.step_batches is None) != (args.steps_out is None):
        return "--step-batches and --steps-out go together: give both, or neither"
    if args.step_batches is None:
        return None
    if args.repeats < 1:
        return f"--repeats must be at least 1 (got {args.repeats})"
    return engine_problem(engine_args(args)) or out_problem(args.steps_out, STEP_WHAT, args.prompt_tokens)


def engine_args(args: argparse.Namespace) -> argparse.Namespace:
    """The run's options with --batches covering both lists, so CUDA graphs are captured at every batch run."""
    return with_batches(args, args.step_batches or ())


def with_batches(args: argparse.Namespace, more: tuple[int | str, ...]) -> argparse.Namespace:
    """``args`` with ``more`` added to --batches (once each, in order): the engine captures a graph for each."""
    return argparse.Namespace(**{**vars(args), "batches": tuple(dict.fromkeys((*args.batches, *more)))})


def profile_batch(
    llm: Any, args: argparse.Namespace, batch: int, vocab_size: int, trace_dir: Path, tokens_per_step: float = 1.0
) -> dict:
    """One profiled generate at ``batch`` after a warm-up, summarised over its last --steps decode steps (under
    speculation, verify steps: ``tokens_per_step`` = the acceptance length sizes the generate)."""
    rng = np.random.default_rng([args.seed, batch, 1])
    timed_generate(llm, prompt_token_ids(rng, batch, args.prompt_tokens, vocab_size), SHORT_TOKENS)  # warm-up
    budget = llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    tokens = profiled_tokens(batch, budget, args.steps, args.prompt_tokens, tokens_per_step)
    before = set(trace_dir.glob(TRACE_GLOB))
    llm.start_profile()
    run = timed_generate(llm, prompt_token_ids(rng, batch, args.prompt_tokens, vocab_size), tokens)
    llm.stop_profile()
    row: dict[str, Any] = {"variant": args.variant, "mode": args.mode, "batch": batch,
                           "prompt_tokens": args.prompt_tokens, "output_tokens": tokens,
                           "generate_s": round(run.seconds, 2), "exact": run.exact,
                           "ran_together": run.together}  # fmt: skip
    trace = newest_trace(trace_dir, before)
    if trace is None:
        return row | {"error": f"no {TRACE_GLOB} written to {trace_dir}"}
    try:
        row |= summarise_trace(trace, batch, args.steps)
    except TraceError as exc:
        row["error"] = str(exc)
    row["trace_mb"] = round(trace.stat().st_size / 2**20, 1)
    if not args.keep_traces:
        trace.unlink()
    return row


def write_markdown(out: Path) -> None:
    rows = [r for r in read_row_file(out / "step_profile.json", WHAT)["rows"] if "kinds" in r]
    (out / "step_profile.md").write_text(f"# Decode step profile\n\n{WHAT}\n\n{markdown(rows)}")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    few = f"--steps must be at least 1 (got {args.steps})" if args.steps < 1 else None
    problem = (engine_problem(args) or few or steps_problem(args)
               or out_problem(args.out / "step_profile.json", WHAT, args.prompt_tokens))  # fmt: skip
    if problem:
        print(f"error: {problem}")
        return 2
    trace_dir = args.out / "traces"
    trace_dir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    started = start_engine(engine_args(args), profiler_config=profiler_config(trace_dir))
    if started is None:
        return 1
    llm, facts = started
    vocab_size = llm.llm_engine.model_config.get_vocab_size()
    command = command_line("replayssm_patch.gpu.step_profile", argv)
    failed = False
    if args.step_batches is not None:
        steps = engine_batches(llm, args, args.step_batches)
        failed |= measure_rows(llm, args, steps, args.steps_out, command, facts, began) > 0
    for batch in engine_batches(llm, args):
        row = profile_batch(llm, args, batch, vocab_size, trace_dir)
        failed |= not record_profile(args.out, row, facts, command, f"{args.variant} {args.mode} B={batch}")
    return 1 if failed else 0


def record_profile(
    out: Path, row: dict[str, Any], facts: dict[str, Any], command: str, label: str, key: tuple[str, ...] = ROW_KEY
) -> bool:
    """Stamp a profiled batch's row with the engine's facts, merge it into out/step_profile.json (by ``key``),
    rewrite the Markdown and log it; False if its trace could not be summarised."""
    row |= {k: facts[k] for k in ("replayssm_layers", "gpu", "vllm", "date")}
    record_row(out / "step_profile.json", row, WHAT, command, facts, key)
    write_markdown(out)
    print(profile_line(label, row), flush=True)
    return "error" not in row


def profile_line(label: str, row: dict[str, Any]) -> str:
    """The log line of one profiled batch: span, kernel and gap µs, µs per kind, CUDA calls per step."""
    shown = {k: row.get(k) for k in ("span_us", "kernel_us", "gap_us", "steps", "error")}
    kinds = {k: v["us"] for k, v in row.get("kinds", {}).items()}
    calls = {k: v["per_step"] for k, v in row.get("host_calls", {}).items()}
    return f"{label}: {json.dumps(shown)}, us per kind {json.dumps(kinds)}, CUDA calls per step {json.dumps(calls)}"


if __name__ == "__main__":
    sys.exit(main())
