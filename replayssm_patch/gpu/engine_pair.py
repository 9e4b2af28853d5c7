"""Engine-side decode step, paired: the baseline and a ReplaySSM variant as two engines on one GPU, their repeats
interleaved (A B, B A, A B, ...) on the same prompts, so the host's slow phases fall on both arms alike.

    python3 -m replayssm_patch.gpu.engine_pair --model MODEL_DIR --candidate replayssm_split --mode default \
        --batches 64,256 --pairs 6 --out replayssm_patch/gpu/results/engine_pair-h200.json

Why: engine_step.py runs one arm's repeats back to back, one engine at a time, and the arms minutes apart. On the
H200 the host's own speed moves in phases of minutes (session 34: the host floor's repeats 15-23 ms at batch 256),
and a second run of the same three arms on the same host moved split precision's ratio at 256 from 1.49x to 1.44x
and fp32's from 1.24x to 1.14x. Here each pair is the two arms' decode windows (decode_window.py, the engine core's
clock) seconds apart on identical prompts; the row holds every pair, the geometric mean of the baseline's window
over the candidate's, and its 95 % t interval over pairs (scipy). Each engine gets --gpu-memory-utilization
(0.45 leaves room for both, as for two servers); the batch's share of each engine's maximum concurrency is in the row.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from replayssm_patch.gpu.engine_step import (
    FIT,
    LONG_TOKENS,
    ROW_FACTS,
    SHORT_TOKENS,
    command_line,
    engine_options,
    engine_problem,
    out_problem,
    preemptions,
    prompt_token_ids,
    run_checks,
    start_engine,
    stepped_generate,
    timed_generate,
    within_budget,
)
from replayssm_patch.gpu.machine_sampling import sampled_conditions, sampling, telemetry_path
from replayssm_patch.gpu.row_file import record_row
from replayssm_patch.gpu.variants import VARIANTS

BASELINE = "baseline"
PAIRS = 6
TWO_ENGINES_MAX_UTIL = 0.47  # each engine's share: two must fit on the card beside CUDA's own memory
WHAT = (
    "Engine-side decode step, paired (vLLM LLM.generate, no HTTP): the baseline and the candidate as two engines on "
    f"one GPU; per pair both arms generate exactly {LONG_TOKENS} tokens (ignore_eos, greedy) for the same B prompts "
    "of prompt_tokens random ids, in the order A B for even pairs and B A for odd ones; each arm's figure is the "
    "decode window (the mean period between the engine core's steps while the whole batch decoded). ratio = "
    "geometric mean over pairs of baseline_ms / candidate_ms, ci_low/ci_high its 95 % t interval over pairs "
    "(scipy.stats.t); baseline_window_ms / candidate_window_ms the medians. Written by "
    "replayssm_patch/gpu/engine_pair.py."
)


def parser() -> argparse.ArgumentParser:
    p = engine_options(argparse.ArgumentParser(description=__doc__.split("\n")[0]), variant=False)
    p.set_defaults(gpu_memory_utilization=0.45)
    p.add_argument("--candidate", choices=[v for v in VARIANTS if v != BASELINE], required=True)
    p.add_argument("--pairs", type=int, default=PAIRS, help=f"pairs per batch [{PAIRS}]")
    p.add_argument("--budget-s", type=float, default=None, help="start no new batch after this many seconds")
    p.add_argument("--out", type=Path, required=True, help="JSON file to merge the rows into")
    return p


def pair_problem(args: argparse.Namespace) -> str | None:
    """One line naming a bad pairing option and its fix, or None."""
    if FIT in args.batches:
        return f"--batches {FIT} sizes one engine's batch; give the batches as numbers for a pair of engines"
    if args.pairs < 2:
        return f"--pairs must be at least 2 for an interval (got {args.pairs})"
    if not 0 < args.gpu_memory_utilization <= TWO_ENGINES_MAX_UTIL:
        return (f"--gpu-memory-utilization {args.gpu_memory_utilization:g} is each engine's share and two must fit: "
                f"give at most {TWO_ENGINES_MAX_UTIL}")  # fmt: skip
    return None


def pair_order(pair: int) -> tuple[str, str]:
    """Which arm generates first in this pair: A B, then B A, so neither arm always follows the other."""
    return (BASELINE, "candidate") if pair % 2 == 0 else ("candidate", BASELINE)


def ratio_interval(baseline_ms: Sequence[float], candidate_ms: Sequence[float]) -> tuple[float, float, float] | None:
    """(ratio, low, high): the geometric mean of baseline / candidate over pairs and its 95 % t interval; None with
    fewer than two pairs."""
    logs = np.log(np.asarray(baseline_ms) / np.asarray(candidate_ms))
    if len(logs) < 2:
        return None
    mean, sem = float(logs.mean()), float(stats.sem(logs))
    half = float(stats.t.ppf(0.975, len(logs) - 1)) * sem
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def pair_row(
    args: argparse.Namespace, batch: int, pairs: Sequence[dict[str, Any]], checks: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The row of one batch: every pair, the ratio with its interval over the pairs both arms' windows measured,
    and each arm's validity facts (run_checks) under its name; valid only if both arms' runs were."""
    timed = [p for p in pairs if p["baseline_ms"] is not None and p["candidate_ms"] is not None]
    found = ratio_interval([p["baseline_ms"] for p in timed], [p["candidate_ms"] for p in timed])
    problems = [f"{arm}: {problem}" for arm, facts in checks.items() for problem in facts["problems"]]
    if found is None:
        problems.append(f"{len(timed)} pair(s) with both decode windows: no interval; run the batch again")
    ratio, low, high = found or (None, None, None)
    return {
        "variant": args.candidate,
        "mode": args.mode,
        "batch": batch,
        "prompt_tokens": args.prompt_tokens,
        "ratio": None if ratio is None else round(ratio, 4),
        "ci_low": None if low is None else round(low, 4),
        "ci_high": None if high is None else round(high, 4),
        "baseline_window_ms": round(statistics.median(p["baseline_ms"] for p in timed), 3) if timed else None,
        "candidate_window_ms": round(statistics.median(p["candidate_ms"] for p in timed), 3) if timed else None,
        "pairs": list(pairs),
        "checks": {arm: {k: v for k, v in facts.items() if k not in ("valid", "problems")}
                   for arm, facts in checks.items()},
        "valid": not problems,
        "problems": problems,
    }  # fmt: skip


def row_line(row: dict[str, Any]) -> str:
    """The line printed per row."""
    shown = "no ratio"
    if row["ratio"] is not None:
        timed = sum(p["baseline_ms"] is not None and p["candidate_ms"] is not None for p in row["pairs"])
        shown = f"{row['ratio']:.3f}x (95% CI {row['ci_low']:.3f}-{row['ci_high']:.3f}x) over {timed} pairs"
    invalid = "" if row["valid"] else " INVALID: " + "; ".join(row["problems"])
    seqs = row.get("max_concurrency") or {}
    load = " / ".join(f"{row['batch'] / seqs[arm]:.0%}" if seqs.get(arm) else "?" for arm in (row["variant"], BASELINE))
    return (f"{row['variant']} vs {BASELINE} {row['mode']} B={row['batch']}: {shown}; windows "
            f"{row['candidate_window_ms']} / {row['baseline_window_ms']} ms; load {load} of each engine's maximum "
            f"concurrency{invalid}")  # fmt: skip


# ---- on the GPU host: everything below imports vLLM or torch --------------------------------------------------


def measure_pairs(engines: dict[str, Any], args: argparse.Namespace, batch: int, vocab_size: int) -> dict[str, Any]:
    """One batch: a warm-up generate on each engine, then --pairs pairs on fresh prompts shared by both arms."""
    before = {arm: preemptions(llm) for arm, llm in engines.items()}
    rng = np.random.default_rng([args.seed, batch])
    for llm in engines.values():
        timed_generate(llm, prompt_token_ids(rng, batch, args.prompt_tokens, vocab_size), SHORT_TOKENS)
    runs: dict[str, list[tuple[int, Any]]] = {arm: [] for arm in engines}
    pairs = []
    for number in range(args.pairs):
        prompts = prompt_token_ids(rng, batch, args.prompt_tokens, vocab_size)
        order = pair_order(number)
        windows = {}
        for arm in order:
            generated = stepped_generate(engines[arm], prompts, LONG_TOKENS)
            runs[arm].append((LONG_TOKENS, generated))
            windows[arm] = None if generated.window is None else round(generated.window.mean_ms, 4)
        pairs.append({"order": "".join("A" if a == BASELINE else "B" for a in order),
                      "baseline_ms": windows[BASELINE], "candidate_ms": windows["candidate"]})  # fmt: skip
        print(f"  B={batch} pair {number}: {pairs[-1]}", flush=True)
    after = {arm: preemptions(llm) for arm, llm in engines.items()}
    checks = {}
    for arm in engines:
        lost = after[arm] - before[arm] if before[arm] is not None and after[arm] is not None else None
        checks[BASELINE if arm == BASELINE else args.candidate] = run_checks(runs[arm], lost)
    return pair_row(args, batch, pairs, checks)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.variant = args.candidate  # engine_problem and the layer check read the variant
    problem = engine_problem(args) or pair_problem(args) or out_problem(args.out, WHAT, args.prompt_tokens)
    if problem:
        print(f"error: {problem}")
        return 2
    began = time.monotonic()
    engines, facts = {}, {}
    for arm, variant in ((BASELINE, BASELINE), ("candidate", args.candidate)):
        started = start_engine(argparse.Namespace(**(vars(args) | {"variant": variant})))
        if started is None:
            return 1
        engines[arm], facts[arm] = started
    command = command_line("replayssm_patch.gpu.engine_pair", argv)
    vocab_size = engines[BASELINE].llm_engine.model_config.get_vocab_size()
    invalid = 0
    for batch in within_budget(args.batches, args.budget_s, began):
        sampled = telemetry_path(args.out, f"{args.candidate}-paired-{args.mode}", batch)
        with sampling(sampled):
            row = measure_pairs(engines, args, batch, vocab_size)
        row |= {k: facts["candidate"][k] for k in ROW_FACTS if k != "max_concurrency"}
        row |= {"max_concurrency": {BASELINE: facts[BASELINE]["max_concurrency"],
                                    args.candidate: facts["candidate"]["max_concurrency"]},
                "conditions": sampled_conditions(sampled)}  # fmt: skip
        record_row(args.out, row, WHAT, command, facts["candidate"])
        print(row_line(row), flush=True)
        invalid += not row["valid"]
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
