"""Engine-side speculative decoding of vLLM 0.24 (offline `LLM.generate`, no HTTP): issue 17's arms.

    export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1   # tools/gpu/session.sh does
    python3 -m replayssm_patch.gpu.spec_step --model MTP_MODEL_DIR --arm replayssm_spec --mode default \
        --batches 64,128,256 --sweep-al 1.0,2.0,2.8,3.0,4.0 --out replayssm_patch/gpu/results/spec_step-h200.json
    python3 -m replayssm_patch.gpu.spec_step --summarise replayssm_patch/gpu/results/spec_step-h200.json

Arms (variants.py SPEC_ARMS): native_standard, native_spec, replayssm_standard, replayssm_spec (ReplaySSM's with
the replayssm_fp32 knobs), replayssm_split_spec (the verify reading the bf16 copy) and replayssm_spec_l28 (a ring of
28: fewer folds), replayssm_split_spec_l28 (both). A spec arm drafts with MTP
(the model dir needs an MTP layer: ../shared/gpu/models/nemotron-h-8b-mtp), k = --spec-tokens, and accepts with
vLLM 0.24's synthetic rejection sampling (`"rejection_sample_method": "synthetic"`, `"synthetic_acceptance_length":
AL`): with random weights a learned drafter accepts nothing, so the acceptance is set, the same in every spec arm,
while the drafter still costs its k passes. An integer AL gives every row the same accepted count; a fractional one
accepts at random.

Method: engine_step.py's (fresh random prompts, a warm-up, alternating repeats of exactly 16 and 272 tokens, its
validity checks), and per batch the median over the repeats (spread = max - min) of
- tokens_per_s = B * 256 / (t272 - t16): output tokens per second, prefill and start-up cancel;
- step_ms = (t272 - t16) / (steps272 - steps16), engine steps counted by vllm:iteration_tokens_total: a verify
  step emits about AL tokens per request, so step time and tokens/s together tell system cost from acceptance;
- window_tokens_per_s and window_step_ms: the same on the engine's clock over the 272-token generate's steps in
  which the whole batch decoded (engine_step.py, decode_window.py), with no prefill in them;
- acceptance_length_measured = 1 + accepted / drafts from the engine's vllm:spec_decode_* counters over the
  timed generates, read as the text vLLM's /metrics serves (the registry llm.get_metrics() reads) through the
  harness's own parser and spec_decode_run (harness/analysis/spec_decode.py). The row is invalid when it is off
  the configured AL by more than [decision] acceptance_tolerance's default (relative), as a paired report is;
- max_concurrency: vLLM's "Maximum concurrency for N tokens per request" (N = max_model_len), which the engine
  core computes from its KV cache config (get_kv_cache_capacity in v1/core/kv_cache_utils.py) and hands the
  front end as cache_config.kv_cache_max_concurrency; read there, with kv_cache_tokens and num_gpu_blocks. Native
  speculation keeps 1 + k state blocks per request, ReplaySSM one: this is where the capacity gain shows.
  `--batches ...,fit` also runs the largest batch the arm holds: that concurrency, at most --max-num-seqs, down to a
  multiple of 32 whose graphs are captured (engine_step.resolved_batches), so each arm's throughput at its own
  capacity is measured in the same job.

The acceptance length is an engine setting, so --sweep-al needs one engine per AL: this process starts each in a
child process of its own, in turn (a fresh process hands the GPU back whole), and starts none after --budget-s.
Rows merge into --out by (arm, mode, k, configured AL, batch); `--summarise FILE` prints the markdown table.

`--profile-batches B,... --profile-out DIR`: after the rows, the same engine (its torch profiler configured at
start-up, idle until then) profiles one generate per batch as step_profile.py does, sized for --steps verify steps of
about AL tokens, into DIR/step_profile.json keyed as the rows are: where the two spec arms' steps differ, by kind.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.analysis.model import SpecDecodeRun
from harness.analysis.server_metrics import Snapshot, Snapshots, means_of, parse_snapshot
from harness.analysis.spec_decode import pooled_acceptance_length, spec_decode_run
from harness.records.metric_registry import DEFAULT_ACCEPTANCE_TOLERANCE
from replayssm_patch.gpu.decode_window import DecodeWindow
from replayssm_patch.gpu.engine_step import (
    LONG_TOKENS,
    REPEATS,
    SHORT_TOKENS,
    Generated,
    command_line,
    engine_batches,
    engine_options,
    engine_problem,
    invalid_suffix,
    median_and_spread,
    out_problem,
    parse_engine_batches,
    repeat_record,
    repeated_generates,
    run_checks,
    start_engine,
    step_ms,
    stepped_generate,
    timed_repeats,
    window_facts,
    within_budget,
)
from replayssm_patch.gpu.machine_sampling import sampled_conditions, sampling, telemetry_path
from replayssm_patch.gpu.row_file import read_row_file, record_row
from replayssm_patch.gpu.spec_summary import summary_markdown
from replayssm_patch.gpu.step_profile import STEPS, profile_batch, profiler_config, record_profile, with_batches
from replayssm_patch.gpu.step_profile import WHAT as PROFILE_WHAT
from replayssm_patch.gpu.variants import ACCEPTANCE_LENGTH, SPEC_ARMS, SPEC_TOKENS, speculative_config

MODULE = "replayssm_patch.gpu.spec_step"
# The exit code of an engine (or sweep) whose budget ran out before it measured anything: EX_TEMPFAIL, which
# tools/gpu/replayssm.sh's queue takes as "continues in the next call" instead of marking the job done.
EXIT_NOTHING_MEASURED = 75
SPEC_KEY = ("arm", "mode", "spec_tokens", "acceptance_length_configured", "batch")
MTP_LAYER_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")  # Nemotron-H / Qwen3-Next; Qwen3.5
# launch_shapes: which launch table the ReplaySSM kernels ran (session 23's rows of two tables had looked alike)
ROW_FACTS = ("max_concurrency", "kv_cache_tokens", "num_gpu_blocks", "max_model_len", "replayssm_layers",
             "launch_shapes", "startup_s", "gpu", "vllm", "date", "gpu_uuid", "cpu_model")  # fmt: skip
WHAT = (
    "Engine-side speculative decoding (vLLM LLM.generate, no HTTP; replayssm_patch/gpu/spec_step.py): "
    "engine_step.py's method (B prompts of 1024 random ids, exactly 16 and 272 output tokens, alternating repeats) "
    "per arm (native/ReplaySSM x standard/MTP speculation with synthetic acceptance). tokens_per_s = B * 256 / "
    "(t272 - t16); step_ms = (t272 - t16) / engine steps between them (vllm:iteration_tokens_total); medians of "
    "the repeats, spreads = max - min. window_tokens_per_s / window_step_ms: the same over the 272-token generate's "
    "whole-batch decode steps on the engine-core clock (no prefill inside), medians of the repeats. "
    "acceptance_length_measured = 1 + accepted / drafts from vllm:spec_decode_* "
    "over the timed generates; max_concurrency = vLLM's 'Maximum concurrency for max_model_len tokens per request'."
)


@dataclass(frozen=True)
class SpecRepeat:
    """One pair of timed generates (seconds), the engine steps each took (None: not counted) and the long
    generate's decode window."""

    t_short_s: float
    t_long_s: float
    steps_short: float | None
    steps_long: float | None
    window: DecodeWindow | None = None


@dataclass(frozen=True)
class Counted:
    """One timed generate with what the engine's counters say about it."""

    run: Generated
    spec: SpecDecodeRun  # increases of the vllm:spec_decode_* and iteration series over the generate
    preempted: float | None


def parse_lengths(text: str) -> tuple[float, ...]:
    """'1,2.8,3' -> (1.0, 2.8, 3.0); argparse shows a bad value's message as one line."""
    try:
        lengths = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        lengths = ()
    if not lengths:
        raise argparse.ArgumentTypeError(f"{text!r}: give acceptance lengths joined by commas, e.g. 1.0,2.8,3.0")
    return lengths


def arm_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The `vllm.LLM` keywords the arm adds to engine_step's llm_kwargs (its variant's knob comes with those)."""
    if not args.speculative:
        return {}
    return {"speculative_config": speculative_config(args.spec_tokens, args.acceptance_length)}


def tokens_per_s(batch: int, t_short_s: float, t_long_s: float) -> float:
    """Output tokens per second of the batch: B requests each emit the extra tokens in the time difference."""
    return batch * 1e3 / step_ms(t_short_s, t_long_s)


def engine_step_ms(repeat: SpecRepeat) -> float | None:
    """Milliseconds per engine step over the extra tokens: the time difference over the step difference."""
    if repeat.steps_short is None or repeat.steps_long is None or repeat.steps_long <= repeat.steps_short:
        return None
    return (repeat.t_long_s - repeat.t_short_s) * 1e3 / (repeat.steps_long - repeat.steps_short)


def acceptance_problem(
    configured: float | None, measured: float | None, tolerance: float = DEFAULT_ACCEPTANCE_TOLERANCE
) -> str | None:
    """Why the measured acceptance length does not fit the arm's configuration, or None when it does."""
    if configured is None:
        return None if measured is None else f"drafts accepted (AL {measured:.3f}) in an arm without speculation"
    if measured is None:
        return "no vllm:spec_decode_* drafts counted: the engine did not speculate"
    apart = abs(measured / configured - 1)
    if apart <= tolerance:
        return None
    return (f"measured acceptance length {measured:.3f} is {apart:.1%} off the configured {configured:g} "
            f"(tolerance {tolerance:.0%}): its speed is not comparable")  # fmt: skip


def speculation_key(args: argparse.Namespace) -> dict[str, Any]:
    """The arm's speculation fields of SPEC_KEY: k and the configured AL, 0 and None for a standard arm."""
    return {"spec_tokens": args.spec_tokens if args.speculative else 0,
            "acceptance_length_configured": args.acceptance_length if args.speculative else None}  # fmt: skip


def make_row(
    args: argparse.Namespace, batch: int, repeats: Sequence[SpecRepeat], counted: Sequence[SpecDecodeRun], **facts: Any
) -> dict[str, Any]:
    """The result row of one batch: medians, spreads, the acceptance measured over `counted` and every repeat;
    `facts` holds run_checks' validity facts, extended here by the acceptance and step-count checks. A stalled
    repeat (``engine_step.timed_repeats``) is kept in `repeats` and counted in `stalled_repeats`, but left out of
    the time-difference figures."""
    timed = timed_repeats(repeats)
    rates, rate_spread = median_and_spread([tokens_per_s(batch, r.t_short_s, r.t_long_s) for r in timed], 1)
    steps, step_spread = median_and_spread([s for s in map(engine_step_ms, timed) if s is not None], 3)
    configured = speculation_key(args)["acceptance_length_configured"]
    measured = pooled_acceptance_length(list(counted))
    problems = [*facts.pop("problems", [])]
    problems += [p for p in [acceptance_problem(configured, measured)] if p]
    if steps is None:
        problems.append("no engine steps counted (vllm:iteration_tokens_total): the step time is unknown")
    drafts = int(sum(r.drafts or 0.0 for r in counted))
    return {
        "arm": args.arm,
        "mode": args.mode,
        "batch": batch,
        "prompt_tokens": args.prompt_tokens,
        **speculation_key(args),
        "acceptance_length_measured": None if measured is None else round(measured, 4),
        "drafts": drafts,
        "tokens_per_s": rates,
        "tokens_per_s_spread": rate_spread,
        "step_ms": steps,
        "step_ms_spread": step_spread,
        f"t{SHORT_TOKENS}_s": round(statistics.fmean(r.t_short_s for r in repeats), 3),
        f"t{LONG_TOKENS}_s": round(statistics.fmean(r.t_long_s for r in repeats), 3),
        **window_facts([r.window for r in repeats]),
        "repeats": [repeat_record(r) for r in repeats],
        "stalled_repeats": len(repeats) - len(timed),
        "variant": args.variant,
        "speculative_config": arm_kwargs(args).get("speculative_config"),
        **facts,
        "valid": not problems,
        "problems": problems,
    }


def row_line(row: dict[str, Any]) -> str:
    """The line printed per row: what the summary needs, at a glance."""
    setting = f" k={row['spec_tokens']} AL={row['acceptance_length_configured']:g}" if row["spec_tokens"] else ""
    return (
        f"{row['arm']} {row['mode']}{setting} B={row['batch']}: {row['tokens_per_s']} tok/s (spread "
        f"{row['tokens_per_s_spread']}), step {row['step_ms']} ms, AL measured {row['acceptance_length_measured']}, "
        f"max concurrency {row.get('max_concurrency')}" + invalid_suffix(row)
    )


def parser() -> argparse.ArgumentParser:
    p = engine_options(argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False), False)
    p.add_argument("--arm", choices=list(SPEC_ARMS), required=True, help="a variant with or without speculation")
    p.add_argument("--spec-tokens", type=int, default=SPEC_TOKENS, help=f"MTP drafts k per step [{SPEC_TOKENS}]")
    p.add_argument("--acceptance-length", type=float, default=ACCEPTANCE_LENGTH,
                   help=f"synthetic AL, in [1, k + 1] [{ACCEPTANCE_LENGTH}]")  # fmt: skip
    p.add_argument("--sweep-al", type=parse_lengths, default=None,
                   help="comma-separated ALs, one engine each, in turn (replaces --acceptance-length)")  # fmt: skip
    p.add_argument("--repeats", type=int, default=REPEATS)
    p.add_argument("--budget-s", type=float, default=None, help="start no new engine or batch after this many s")
    p.add_argument("--out", type=Path, required=True, help="JSON file to merge the rows into")
    p.add_argument("--summarise", type=Path, metavar="FILE", help="print FILE's markdown summary; starts nothing")
    p.add_argument("--profile-batches", type=parse_engine_batches, default=None,
                   help="after the rows, step_profile.py's profile of the arm at these batches")  # fmt: skip
    p.add_argument("--profile-out", type=Path, default=None, help="dir for the profile's step_profile.json / .md")
    p.add_argument("--steps", type=int, default=STEPS, help=f"verify steps summarised per profiled batch [{STEPS}]")
    p.add_argument("--keep-traces", action="store_true", help="keep the profile's raw traces")
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The options, with the arm's variant and whether it speculates; one --sweep-al value is that AL."""
    args = parser().parse_args(argv)
    args.variant, args.speculative = SPEC_ARMS[args.arm]
    if args.sweep_al is not None and len(args.sweep_al) == 1:
        args.acceptance_length, args.sweep_al = args.sweep_al[0], None
    return args


def has_mtp_layer(model_dir: Path) -> bool:
    """Whether the model's config.json (or its text_config) declares MTP layers for vLLM's `mtp` method."""
    config = json.loads((model_dir / "config.json").read_text())
    parts = [config, config.get("text_config") or {}]
    return any(int(part.get(key) or 0) > 0 for part in parts for key in MTP_LAYER_KEYS)


def spec_problem(args: argparse.Namespace) -> str | None:
    """One line naming a bad speculative option and its fix, or None (engine options are checked before)."""
    if args.spec_tokens < 1:
        return f"--spec-tokens must be at least 1 (got {args.spec_tokens})"
    if not args.speculative:
        spec_arms = ", ".join(arm for arm, (_, spec) in SPEC_ARMS.items() if spec)
        return f"--sweep-al applies to the spec arms ({spec_arms}); drop it for {args.arm}" if args.sweep_al else None
    top = args.spec_tokens + 1
    outside = [al for al in args.sweep_al or (args.acceptance_length,) if not 1 <= al <= top]
    if outside:
        return f"acceptance length {outside[0]:g} is outside [1, {top}], vLLM 0.24's range at k = {args.spec_tokens}"
    if not has_mtp_layer(args.model):
        return (
            f"{args.model / 'config.json'} declares no MTP layer ({' / '.join(MTP_LAYER_KEYS)}); give --model "
            "the MTP config dir (../shared/gpu/models/nemotron-h-8b-mtp; /tmp/model-mtp on the GPU host)"
        )
    return None


def profile_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the profile options, or None (also when there is no profile)."""
    if (args.profile_batches is None) != (args.profile_out is None):
        return "--profile-batches and --profile-out go together: give both, or neither"
    if args.profile_batches is None:
        return None
    if args.steps < 1:
        return f"--steps must be at least 1 (got {args.steps})"
    return out_problem(args.profile_out / "step_profile.json", PROFILE_WHAT, args.prompt_tokens)


def child_command(argv: Sequence[str], length: float, budget_left_s: float | None) -> list[str]:
    """One AL's engine as a process of its own: this run's arguments, then that AL alone (argparse keeps an
    option's last value) and what is left of the budget."""
    al = f"{length:g}"
    budget = [] if budget_left_s is None else ["--budget-s", f"{max(budget_left_s, 0.0):.0f}"]
    return [sys.executable, "-m", MODULE, *argv, "--acceptance-length", al, "--sweep-al", al, *budget]


def sweep(argv: Sequence[str], args: argparse.Namespace) -> int:
    """Each AL of --sweep-al on an engine of its own, in turn; the worst exit code of the engines
    (``EXIT_NOTHING_MEASURED`` when none started). A next engine starts only while as much of --budget-s is left as
    the last one took (it would be killed half-way)."""
    began, codes, last_s = time.monotonic(), [], 0.0
    for length in within_budget(args.sweep_al, args.budget_s, began, label="AL {:g}"):
        left = None if args.budget_s is None else args.budget_s - (time.monotonic() - began)
        if left is not None and left < last_s:
            print(f"skipped AL {length:g} and later: {left:.0f} s of --budget-s left, the last engine took "
                  f"{last_s:.0f} s", flush=True)  # fmt: skip
            break
        print(f"{args.arm} AL {length:g}: engine in a process of its own", flush=True)
        started = time.monotonic()
        codes.append(subprocess.call(child_command(argv, length, left)))
        last_s = time.monotonic() - started
    return max(codes, default=EXIT_NOTHING_MEASURED)


def summarise(path: Path) -> int:
    try:
        rows = read_row_file(path, WHAT)["rows"]
    except ValueError as exc:  # RowFileError: the message names the fix
        print(f"error: {exc}")
        return 2
    if not rows:
        print(f"error: {path} holds no rows; give the file spec_step wrote with --out")
        return 2
    print(summary_markdown(rows), end="")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    only = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    only.add_argument("--summarise", type=Path)
    wanted, rest = only.parse_known_args(argv)
    if wanted.summarise is not None:
        return summarise(wanted.summarise) if not rest else _refused(f"--summarise takes no other option ({rest[0]})")
    args = parse_args(argv)
    few = f"--repeats must be at least 1 (got {args.repeats})" if args.repeats < 1 else None
    problem = (engine_problem(args) or spec_problem(args) or few or out_problem(args.out, WHAT, args.prompt_tokens)
               or profile_problem(args))  # fmt: skip
    if problem:
        return _refused(problem)
    return sweep(argv, args) if args.sweep_al else run_engine(args, argv)


def _refused(problem: str) -> int:
    print(f"error: {problem}")
    return 2


# ---- on the GPU host: everything below imports vLLM or torch --------------------------------------------------


def metrics_snapshot() -> Snapshot:
    """The engine's series as vLLM's /metrics serves them, parsed by the harness, so the counters mean here what
    they mean in a report (the same registry llm.get_metrics() reads; no HTTP server runs)."""
    from prometheus_client import generate_latest
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    return parse_snapshot(generate_latest(get_prometheus_registry()).decode())


def counted_generate(llm: Any, prompts: list[list[int]], tokens: int) -> Counted:
    """engine_step's stepped generate, with the counters' increase over it (read outside the timed span)."""
    before = metrics_snapshot()
    run = stepped_generate(llm, prompts, tokens)
    snapshots = Snapshots(before, metrics_snapshot())
    return Counted(run, spec_decode_run(snapshots, run.seconds, None), means_of(snapshots).preemptions)


def kv_capacity(llm: Any) -> dict[str, Any]:
    """vLLM's KV-cache capacity as its engine core computed it (module docstring): requests of max_model_len."""
    config = llm.llm_engine.vllm_config
    return {
        "kv_cache_tokens": config.cache_config.kv_cache_size_tokens,
        "num_gpu_blocks": config.cache_config.num_gpu_blocks,
        "max_model_len": config.model_config.max_model_len,
    }


def measure_batch(llm: Any, args: argparse.Namespace, batch: int, vocab_size: int) -> dict[str, Any]:
    """The batch's row; ``repeat_ends_s`` says when each repeat ended after the batch began, on the clock of its
    telemetry samples (started just before), so a slow repeat can be set beside the GPU's clocks at that time."""
    repeats, counted, ends, began = [], [], [], time.monotonic()
    for r, generated in enumerate(repeated_generates(llm, args, batch, vocab_size, counted_generate)):
        counted += generated.items()
        ends.append(round(time.monotonic() - began, 1))
        short, long = generated[SHORT_TOKENS], generated[LONG_TOKENS]
        repeats.append(SpecRepeat(short.run.seconds, long.run.seconds, short.spec.engine_steps,
                                  long.spec.engine_steps, long.run.window))  # fmt: skip
        step = engine_step_ms(repeats[-1])
        print(f"  B={batch} repeat {r}: {tokens_per_s(batch, short.run.seconds, long.run.seconds):.1f} tok/s, "
              f"step {'?' if step is None else f'{step:.3f}'} ms, ended at {ends[-1]} s", flush=True)  # fmt: skip
    lost = [c.preempted for _, c in counted]
    preempted = None if None in lost else int(sum(lost))
    checks = run_checks([(tokens, c.run) for tokens, c in counted], preempted)
    return make_row(args, batch, repeats, [c.spec for _, c in counted], **checks) | {"repeat_ends_s": ends}


def telemetry_name(args: argparse.Namespace) -> str:
    """What names an engine's telemetry file: its arm, speculative setting (arms share variants) and mode."""
    setting = f"-k{args.spec_tokens}-al{args.acceptance_length:g}" if args.speculative else ""
    return f"{args.arm}{setting}-{args.mode}"


def run_engine(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """One engine (one AL) through every batch within the budget; 1 if any row is invalid."""
    began = time.monotonic()
    setting = f" k={args.spec_tokens} AL={args.acceptance_length:g}" if args.speculative else ""
    extra = arm_kwargs(args)
    if args.profile_batches is not None:  # configured, idle until start_profile; graphs at the profile's batches too
        (args.profile_out / "traces").mkdir(parents=True, exist_ok=True)
        extra["profiler_config"] = profiler_config(args.profile_out / "traces")
    started = start_engine(with_batches(args, args.profile_batches or ()), f"{args.arm} {args.mode}{setting}", **extra)
    if started is None:
        return 1
    llm, facts = started
    facts |= kv_capacity(llm)
    print(f"{args.arm}: maximum concurrency {facts['max_concurrency']} at {facts['max_model_len']} tokens per "
          f"request, KV cache {facts['kv_cache_tokens']} tokens", flush=True)  # fmt: skip
    vocab_size = llm.llm_engine.model_config.get_vocab_size()
    invalid, measured = 0, 0
    for batch in within_budget(engine_batches(llm, args), args.budget_s, began):
        # the SM clock and the host while it ran (session 23: ReplaySSM's fp32 arms took 25-36 ms a step on one host
        # against 21.5 on another, varying by repeat, where native spec did not, and nothing said why)
        sampled = telemetry_path(args.out, telemetry_name(args), batch)
        with sampling(sampled):
            row = measure_batch(llm, args, batch, vocab_size)
        row |= {k: facts[k] for k in ROW_FACTS} | {"conditions": sampled_conditions(sampled)}
        record_row(args.out, row, WHAT, command_line(MODULE, list(argv)), facts, SPEC_KEY)
        print(row_line(row), flush=True)
        invalid, measured = invalid + (not row["valid"]), measured + 1
    if not measured:  # the start-up took the budget (session 21: two jobs were marked done with no row)
        print(f"{args.arm}: nothing measured within --budget-s; exit {EXIT_NOTHING_MEASURED}: run it again",
              flush=True)  # fmt: skip
        return EXIT_NOTHING_MEASURED
    if args.profile_batches is not None:
        invalid += profile_rows(llm, args, vocab_size, facts, command_line(MODULE, list(argv)))
    return 1 if invalid else 0  # invalid rows are kept (with their problems), but the run says it failed


def profile_rows(llm: Any, args: argparse.Namespace, vocab_size: int, facts: dict[str, Any], command: str) -> int:
    """step_profile.py's profile of this arm at --profile-batches into --profile-out (keyed as the rows are, so
    both spec arms and every AL share a file); a verify step emits about AL tokens, which sizes the generate. How
    many batches failed."""
    trace_dir, failed = args.profile_out / "traces", 0
    per_step = args.acceptance_length if args.speculative else 1.0
    for batch in engine_batches(llm, args, args.profile_batches):
        row = profile_batch(llm, args, batch, vocab_size, trace_dir, per_step) | {"arm": args.arm}
        label = f"{args.arm} {args.mode} B={batch}"
        failed += not record_profile(args.profile_out, row | speculation_key(args), facts, command, label, SPEC_KEY)
    return failed


if __name__ == "__main__":
    sys.exit(main())
