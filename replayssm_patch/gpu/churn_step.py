"""Engine-side step under churn: B requests decode while finished ones are replaced by fresh prompts, so prefill
chunks land in decode steps as they do in a served load (vLLM's engine stepped directly, no HTTP).

    python3 -m replayssm_patch.gpu.churn_step --model MODEL_DIR --variant replayssm_fp32 --mode default \
        --batches 64,128 --out replayssm_patch/gpu/results/churn_step-h200.json

Why: engine_step.py measures closed batches, whose decode window holds no prefill, but a served replay's steps are
mostly mixed. On the H200 (2026-12-03, qwen3.5-4b, Azure conversations at ~65 % of the baseline's capacity, 5.3
prompt tokens per output token) ReplaySSM's served TPOT p50 was 18 % worse and its engine steps/s (server metrics)
21 % lower, while its closed-batch decode steps at 16-64 were 0.95-1.13x the baseline's: the mixed steps are
where the served loss is, and they need an engine-side figure of their own.

Method: B requests are started with staggered output lengths (request i gets (i + 1) / B of --output-tokens), so
finishes, and with them new prompts, spread evenly: in steady state B / output_tokens new prompts of
--prompt-tokens random ids per step. Each request that finishes is replaced at once (exact lengths: ignore_eos,
min_tokens = max_tokens, greedy). After a warm-up of --output-tokens steps (every first-wave request has
finished), the engine core's timestamps of the next --steps steps give each step's period; a step that put out
some request's first token held that request's prefill (a "mixed" step). Per repeat: the mean period of all
steps, of the decode-only and of the mixed ones (``churn_window`` says how async scheduling is accounted for), the
share of mixed steps and the output tokens per second over the window; the row holds the medians over repeats
and the spread of the means, and each repeat what the machine did meanwhile (``repeats[].conditions``: host CPU and
the GPU's SM clock against its maximum, sampled once a second into <results stem>-telemetry/ beside --out), since an
engine under churn slows from one repeat to the next. The requests still running at the end are aborted. Prefix caching
is off and every prompt is fresh.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from replayssm_patch.gpu.decode_window import EngineStep, observed_step
from replayssm_patch.gpu.engine_step import (
    ROW_FACTS,
    command_line,
    delta_params,
    engine_batches,
    engine_options,
    engine_problem,
    invalid_suffix,
    preemptions,
    prompt_token_ids,
    start_engine,
    within_budget,
)
from replayssm_patch.gpu.machine_sampling import sampled_conditions, sampling, telemetry_path
from replayssm_patch.gpu.row_file import ROW_KEY, record_row, row_file_problem
from replayssm_patch.gpu.step_profile import TRACE_GLOB, newest_trace, profiler_config, record_profile
from replayssm_patch.gpu.trace_summary import TraceError, summarise_trace

OUTPUT_TOKENS = 192  # with 1,024-token prompts: 5.3 prompt tokens per output token, the served A/B's mix
STEPS = 512
PROFILED_STEPS = 64  # the profiled churn run's measured steps: enough of both kinds, a trace of tens of MB
REPEATS = 3
ROW_KEY_CHURN = (*ROW_KEY, "prompt_tokens", "output_tokens")
WHAT = (
    "Engine-side step under churn (vLLM's engine stepped directly, no HTTP): B requests decode at all times, each "
    "finished one replaced at once by a fresh prompt of prompt_tokens random ids (first wave's output lengths "
    "staggered over output_tokens, then exactly output_tokens each), so B / output_tokens prefills per step land "
    "beside the decode rows. After output_tokens warm-up steps, the engine core's timestamps of `steps` steps: "
    "step_ms = median over repeats of the mean period, spread_ms = max - min of those means, last_over_first = the "
    "last repeat's mean over the first's (the engine's drift as it serves); decode_step_ms the "
    "same of the periods whose step and the next one only decode (under async scheduling a period holds its "
    "step's GPU work and the next step's launches), mixed_step_ms that plus the window's time beyond it shared "
    "over the steps that put out a request's first token (its prefill); mixed_share = share of mixed steps; "
    "tokens_per_s = output tokens over the window; mean_rows = requests per step (a replacement joins a step or "
    "two after its predecessor ends); a KV cache that runs short shows as preemptions. Written by "
    "replayssm_patch/gpu/churn_step.py."
)


@dataclass(frozen=True)
class ChurnWindow:
    """One repeat's measured steps (milliseconds; None where no step of that kind could be measured)."""

    steps: int
    mean_ms: float
    mixed_ms: float | None
    decode_ms: float | None
    mixed_share: float
    tokens_per_s: float
    mean_rows: float  # requests per measured step: a replacement joins a step or two after its predecessor ends
    fewest_rows: int


def replacement_gap(batch: int) -> int:
    """How many requests short of B a decode-only step may run and still count as one at B (replacements join a step
    or two after the requests they replace end): B / 16, at least 2."""
    return max(2, batch // 16)


def first_wave_lengths(batch: int, output_tokens: int) -> list[int]:
    """Output lengths of the first B requests, spread evenly up to output_tokens so that their finishes (and the
    prompts replacing them) do not come together."""
    return [max(1, round(output_tokens * (i + 1) / batch)) for i in range(batch)]


def churn_window(steps: Sequence[EngineStep]) -> ChurnWindow | None:
    """The periods between consecutive steps' outputs, and from them the decode-only and the mixed step; None with
    fewer than two stamped steps.

    Under vLLM's async scheduling (its default) the period that ends with step n's outputs holds step n's GPU work
    and the host's scheduling and launching of step n + 1, so a mixed step's cost spills into the period before
    it. The decode-only step is therefore the mean period whose step and successor both only decode, and the mixed
    step is that plus the window's time beyond it shared over its mixed steps: exact under either scheduling."""
    if len(steps) < 2 or any(s.stamp_s <= 0 for s in steps):
        return None
    periods_ms = np.diff([s.stamp_s for s in steps]) * 1e3
    mixed = np.array([s.started > 0 for s in steps[1:]])
    clean = ~mixed & ~np.append(mixed[1:], True)  # the last period's successor is unknown: never clean
    decode_ms = float(periods_ms[clean].mean()) if clean.any() else None
    mixed_ms = None
    if decode_ms is not None and mixed.any():
        mixed_ms = decode_ms + (float(periods_ms.sum()) - decode_ms * len(periods_ms)) / int(mixed.sum())
    rows = [s.rows for s in steps[1:]]
    return ChurnWindow(
        steps=len(periods_ms),
        mean_ms=round(float(periods_ms.mean()), 4),
        mixed_ms=None if mixed_ms is None else round(mixed_ms, 4),
        decode_ms=None if decode_ms is None else round(decode_ms, 4),
        mixed_share=round(float(mixed.mean()), 4),
        tokens_per_s=round(sum(s.tokens for s in steps[1:]) * 1e3 / float(periods_ms.sum()), 1),
        mean_rows=round(statistics.fmean(rows), 2),
        fewest_rows=min(rows),
    )


class Churn:
    """Keeps B requests in vLLM's engine, replacing each finished one by a fresh prompt, and records each step."""

    def __init__(self, engine: Any, args: argparse.Namespace, batch: int, rng: np.random.Generator, vocab: int):
        self.engine, self.args, self.rng, self.vocab = engine, args, rng, vocab
        self.live: set[str] = set()
        self.seen: set[str] = set()
        self.added = 0
        for tokens in first_wave_lengths(batch, args.output_tokens):
            self.add(tokens)

    def add(self, tokens: int) -> None:
        from vllm.inputs import TokensPrompt

        ids = prompt_token_ids(self.rng, 1, self.args.prompt_tokens, self.vocab)[0]
        request_id = f"churn-{id(self)}-{self.added}"
        self.added += 1
        self.engine.add_request(request_id, TokensPrompt(prompt_token_ids=ids), delta_params(tokens))
        self.live.add(request_id)

    def step(self) -> EngineStep:
        """The next engine step that put tokens out; its finished requests are replaced before the one after."""
        outputs = self.engine.step()
        while not outputs:
            outputs = self.engine.step()
        step = observed_step(outputs, self.seen)
        for finished in (o.request_id for o in outputs if o.finished):
            self.live.discard(finished)
            self.add(self.args.output_tokens)
        return step

    def run(
        self,
        warmup: int,
        steps: int,
        on_measure: Callable[[], object] | None = None,
        measure_step: Callable[[Callable[[], EngineStep]], EngineStep] | None = None,
    ) -> list[EngineStep]:
        """`warmup` steps unrecorded, then (after ``on_measure``, e.g. starting a profiler) `steps` measured ones (each
        a period from the step before: one stamp more), each through ``measure_step`` if given (it calls the step it
        is handed, e.g. under a profiler of its own); every request left is aborted after."""
        for _ in range(warmup):
            self.step()
        if on_measure is not None:
            on_measure()
        measure = measure_step or (lambda step: step())
        recorded = [measure(self.step) for _ in range(steps + 1)]
        self.engine.abort_request(sorted(self.live))
        while self.engine.has_unfinished_requests():
            self.engine.step()
        return recorded


def make_row(
    args: argparse.Namespace,
    batch: int,
    windows: Sequence[ChurnWindow | None],
    lost: int | None,
    conditions: Sequence[dict[str, Any] | None] = (),
) -> dict:
    """The row of one batch: medians over repeats, the spread of the repeats' mean steps, and why it is invalid.
    ``conditions``: per repeat, what the machine did meanwhile (``sampled_conditions``), kept beside its timings."""
    seen = [w for w in windows if w is not None]
    problems = [f"{len(windows) - len(seen)} repeat(s) without engine timestamps"] if len(seen) < len(windows) else []
    if lost:
        problems.append(f"{lost} preemption(s): the KV cache ran short")

    def median(field: str) -> float | None:
        values = [getattr(w, field) for w in seen if getattr(w, field) is not None]
        return round(statistics.median(values), 3) if values else None

    means = [w.mean_ms for w in seen]
    return {
        "variant": args.variant,
        "mode": args.mode,
        "batch": batch,
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "step_ms": median("mean_ms"),
        "spread_ms": round(max(means) - min(means), 3) if means else None,
        # the engine slows as it serves (H200: +23 % from the first repeat to the second, both arms): compare arms
        # repeat by repeat, each from a fresh engine
        "last_over_first": round(means[-1] / means[0], 4) if len(means) > 1 else None,
        "mixed_step_ms": median("mixed_ms"),
        "decode_step_ms": median("decode_ms"),
        "mixed_share": median("mixed_share"),
        "tokens_per_s": median("tokens_per_s"),
        "mean_rows": median("mean_rows"),
        "steps": min((w.steps for w in seen), default=0),
        "repeats": [
            None if w is None else asdict(w) | {"conditions": c}
            for w, c in itertools.zip_longest(windows, conditions[: len(windows)])
        ],
        "preemptions": lost,
        "valid": not problems and bool(seen),
        "problems": problems,
    }


def row_line(row: dict[str, Any]) -> str:
    return (
        f"{row['variant']} {row['mode']} B={row['batch']} churn: step {row['step_ms']} ms (spread {row['spread_ms']}), "
        f"mixed {row['mixed_step_ms']} ms, decode-only {row['decode_step_ms']} ms, mixed share {row['mixed_share']}, "
        f"{row['tokens_per_s']} tok/s over {row['steps']} steps, last/first repeat {row['last_over_first']}"
        + invalid_suffix(row)
    )


def parser() -> argparse.ArgumentParser:
    p = engine_options(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    p.add_argument("--output-tokens", type=int, default=OUTPUT_TOKENS,
                   help=f"tokens per replacing request [{OUTPUT_TOKENS}]: B / this many prefills per step")  # fmt: skip
    p.add_argument("--steps", type=int, default=STEPS, help=f"measured steps per repeat [{STEPS}]")
    p.add_argument("--repeats", type=int, default=REPEATS)
    p.add_argument("--budget-s", type=float, default=None, help="start no new batch after this many seconds")
    p.add_argument("--profile-out", type=Path, default=None,
                   help="after a batch's rows, one more churn run under the torch profiler; its decode-only and "
                   "mixed steps summarised apart (kernel µs per kind, CUDA calls per step) into "
                   "DIR/step_profile.json")  # fmt: skip
    p.add_argument("--keep-traces", action="store_true", help="keep the profiler's trace files")
    p.add_argument("--out", type=Path, required=True, help="JSON file to merge the rows into")
    return p


def profile_churn(llm: Any, args: argparse.Namespace, batch: int, vocab: int, trace_dir: Path) -> list[dict]:
    """One more churn run with the profiler on over its measured steps, summarised twice: the decode-only steps
    at the batch and the mixed ones (a prefill beside the decodes, whose mixers run eagerly)."""
    rng = np.random.default_rng([args.seed, batch, 1])
    before = set(trace_dir.glob(TRACE_GLOB))
    churn = Churn(llm.llm_engine, args, batch, rng, vocab)
    churn.run(args.output_tokens, min(args.steps, PROFILED_STEPS), on_measure=llm.start_profile)
    llm.stop_profile()
    trace = newest_trace(trace_dir, before)
    rows = []
    for kind in ("decode", "mixed"):
        row = {"variant": args.variant, "mode": args.mode, "batch": batch, "prompt_tokens": args.prompt_tokens,
               "output_tokens": args.output_tokens, "step_kind": kind}  # fmt: skip
        try:
            if trace is None:
                raise TraceError(f"no {TRACE_GLOB} written to {trace_dir}")
            row |= summarise_trace(trace, batch, mixed=kind == "mixed", rows_from=batch - replacement_gap(batch))
        except TraceError as exc:
            row["error"] = str(exc)
        rows.append(row)
    if trace is not None and not args.keep_traces:
        trace.unlink()
    return rows


def count_problem(args: argparse.Namespace, names: Sequence[str]) -> str | None:
    """The first of the options ``names`` below 1, as one line, or None."""
    small = [name for name in names if getattr(args, name) < 1]
    return f"--{small[0].replace('_', '-')} must be at least 1 (got {getattr(args, small[0])})" if small else None


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    counts = count_problem(args, ("output_tokens", "steps", "repeats"))
    # prompt and output lengths are in the row key, so rows of other lengths stay beside these
    problem = engine_problem(args) or counts or row_file_problem(args.out, WHAT)
    if problem:
        print(f"error: {problem}")
        return 2
    began = time.monotonic()
    trace_dir = args.profile_out / "traces" if args.profile_out else None
    if trace_dir is not None:
        trace_dir.mkdir(parents=True, exist_ok=True)
    started = start_engine(args, **({"profiler_config": profiler_config(trace_dir)} if trace_dir else {}))
    if started is None:
        return 1
    llm, facts = started
    command = command_line("replayssm_patch.gpu.churn_step", argv)
    vocab = llm.llm_engine.model_config.get_vocab_size()
    invalid = 0
    for batch in within_budget(engine_batches(llm, args), args.budget_s, began):
        rng = np.random.default_rng([args.seed, batch])
        before = preemptions(llm)
        windows, conditions = [], []
        for repeat in range(args.repeats):
            sampled = telemetry_path(args.out, f"{args.variant}-{args.mode}", batch, repeat)
            with sampling(sampled):
                steps = Churn(llm.llm_engine, args, batch, rng, vocab).run(args.output_tokens, args.steps)
            windows.append(churn_window(steps))
            conditions.append(sampled_conditions(sampled))
        after = preemptions(llm)
        lost = after - before if before is not None and after is not None else None
        row = make_row(args, batch, windows, lost, conditions) | {k: facts[k] for k in ROW_FACTS}
        record_row(args.out, row, WHAT, command, facts, key=ROW_KEY_CHURN)
        print(row_line(row), flush=True)
        invalid += not row["valid"]
        if trace_dir is not None:
            for profiled in profile_churn(llm, args, batch, vocab, trace_dir):
                label = f"{args.variant} {args.mode} B={batch} churn {profiled['step_kind']} steps"
                key = (*ROW_KEY_CHURN, "step_kind")
                invalid += not record_profile(args.profile_out, profiled, facts, command, label, key)
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
