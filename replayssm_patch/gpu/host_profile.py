"""Where vLLM 0.24's host time per decode step goes: the engine run in this process under cProfile.

    python3 -m replayssm_patch.gpu.host_profile --model /tmp/model-floor --variant baseline --mode O0 \
        --batches 256 --out /tmp/gpu/out/host_profile-h200.json

Why: at toy widths (gpu/host_floor.py) the engine-side step at batch 256 is 14-20 ms with next to no GPU work, so
vLLM's host side, not the SSM kernels, bounds the step there. This says which functions that host time is in.
With VLLM_ENABLE_V1_MULTIPROCESSING=0 the engine core, the scheduler, the worker and the output processing all
run on this one thread (the uniproc executor's futures are not threads), so one cProfile sees every host
microsecond. Method: per batch a warm-up, then a 16- and a 272-token generate timed without the profiler (the
in-process step), then the same pair under cProfile; a function's cost per decode step is its 272-token time minus
its 16-token time over the 256 extra steps, so prefill and start-up cancel as in engine_step.py. cProfile slows
Python calls, so compare shares, not absolute figures, with the unprofiled step beside them.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from replayssm_patch.gpu.engine_step import (
    LONG_TOKENS,
    SHORT_TOKENS,
    command_line,
    engine_batches,
    engine_options,
    engine_problem,
    out_problem,
    prompt_token_ids,
    start_engine,
    step_ms,
    timed_generate,
)
from replayssm_patch.gpu.row_file import record_row

TOP = 30  # functions kept per list
FUNCTION_FLOOR_US = 1.0  # functions kept for comparing arms: at least this many µs per step, inclusive
DIFF_TOP = 15  # functions shown per arm difference
WHAT = (
    "Host time per decode step of vLLM 0.24 by function: the engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0), "
    f"cProfile of a {SHORT_TOKENS}- and a {LONG_TOKENS}-token generate of B prompts of prompt_tokens random ids; "
    f"per function (t{LONG_TOKENS} - t{SHORT_TOKENS}) / {LONG_TOKENS - SHORT_TOKENS} in microseconds per step, self "
    "(tottime) and inclusive (cumtime). step_ms: the in-process step without the profiler; profiled_step_ms: with "
    "it. Written by replayssm_patch/gpu/host_profile.py."
)
FunctionKey = tuple[str, int, str]  # pstats' (file, line, function)


@dataclass(frozen=True)
class FunctionCost:
    """One function's host time per decode step."""

    function: str  # "module path:line(name)", the path from the package root on
    self_us: float
    total_us: float
    calls: float  # per step


PACKAGES = ("vllm", "torch", "triton", "replayssm_patch", "harness")  # whose paths are shown from the package on


def short_path(path: str) -> str:
    """A source path from its package's root on (/tmp/site/vllm/v1/core/... -> vllm/v1/core/...)."""
    starts = [path.rfind(f"/{package}/") for package in PACKAGES if f"/{package}/" in path]  # the innermost root
    return path[max(starts) + 1 :] if starts else path


def function_name(key: FunctionKey) -> str:
    path, line, name = key
    return f"{short_path(path)}:{line}({name})" if line else name  # line 0: a builtin such as {method 'tolist'}


def per_step_costs(short: dict[FunctionKey, tuple], long: dict[FunctionKey, tuple], steps: int) -> list[FunctionCost]:
    """Every function's extra cost in the long run per extra step; `short` and `long` are pstats' raw `stats`
    dicts (key -> (primitive calls, calls, tottime, cumtime, callers))."""
    costs = []
    for key, (_, calls, self_s, total_s, _) in long.items():
        _, calls_0, self_0, total_0, _ = short.get(key, (0, 0, 0.0, 0.0, None))
        per_step = ((self_s - self_0) / steps * 1e6, (total_s - total_0) / steps * 1e6, (calls - calls_0) / steps)
        costs.append(FunctionCost(function_name(key), *(round(v, 2) for v in per_step)))
    return costs


def top(costs: Iterable[FunctionCost], field: str, count: int = TOP) -> list[dict[str, Any]]:
    return [asdict(c) for c in sorted(costs, key=lambda c: getattr(c, field), reverse=True)[:count]]


def comparable_functions(costs: list[FunctionCost]) -> list[list]:
    """Every function of at least FUNCTION_FLOOR_US per step as [function, self µs, total µs, calls], from which two
    arms' rows are compared (``arm_difference``)."""
    return [[c.function, c.self_us, c.total_us, c.calls] for c in costs if c.total_us >= FUNCTION_FLOOR_US]


def cost_fields(costs: list[FunctionCost]) -> dict[str, Any]:
    """A row's function costs: the top lists it shows, and its ``comparable_functions``."""
    return {"by_self": top(costs, "self_us"), "by_total": top(costs, "total_us"),
            "functions": comparable_functions(costs)}  # fmt: skip


# vLLM functions whose work per step the plugin leaves alone (same calls, same inputs): how long they took in two runs
# is how fast the host ran in each. On 2026-12-03 they took 1.25x as long in the baseline's profiled run as in the
# candidate's, on one host, which hid 3 ms per step of the candidate's extra host time.
HOST_SPEED_REFERENCE = (("vllm/v1/core/sched/scheduler.py", "schedule"),
                        ("vllm/v1/core/sched/scheduler.py", "update_from_output"),
                        ("vllm/v1/engine/output_processor.py", "process_outputs"))  # fmt: skip
_NAME = re.compile(r"^(?P<path>.*):\d+\((?P<name>.*)\)$")


def reference_us(row: dict[str, Any]) -> float:
    """The row's inclusive µs per step in ``HOST_SPEED_REFERENCE`` (0 where it has none of them)."""
    total = 0.0
    for function, _, total_us, _ in row.get("functions", []):
        match = _NAME.match(function)
        if match and (match["path"], match["name"]) in HOST_SPEED_REFERENCE:
            total += total_us
    return total


def host_slowdown(row: dict[str, Any], baseline: dict[str, Any]) -> float | None:
    """How much slower the host ran ``row``'s profiled run than ``baseline``'s, by the reference functions (1.0:
    as fast; None where either row lacks them)."""
    mine, theirs = reference_us(row), reference_us(baseline)
    return round(mine / theirs, 3) if mine > 0 and theirs > 0 else None


def arm_difference(row: dict[str, Any], baseline: dict[str, Any], field: str, count: int = DIFF_TOP) -> list[dict]:
    """The functions on which ``row`` spends the most host time per step beyond ``baseline`` (``field``: self_us or
    total_us), largest first; a function one row lacks counts 0 there. The baseline's costs are first scaled by
    ``host_slowdown``, so a host that ran one arm slower does not hide or invent a difference."""
    index = 1 if field == "self_us" else 2
    scale = host_slowdown(row, baseline) or 1.0
    theirs = {f[0]: f[index] for f in baseline["functions"]}
    mine = {f[0]: f for f in row["functions"]}
    extra = {name: (mine[name][index] if name in mine else 0.0) - scale * theirs.get(name, 0.0)
             for name in mine.keys() | theirs.keys()}  # fmt: skip
    ranked = sorted(extra.items(), key=lambda item: -item[1])[:count]
    return [{"function": name, "extra_us": round(us, 2), "calls": mine[name][3] if name in mine else 0.0}
            for name, us in ranked]  # fmt: skip


def baseline_of(row: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The baseline row measured like ``row`` (same mode, batch and workload lengths), if any, with function costs."""
    same = ("mode", "batch", "prompt_tokens", "output_tokens")
    return next((r for r in rows if r["variant"] == "baseline" and "functions" in r
                 and all(r.get(k) == row.get(k) for k in same)), None)  # fmt: skip


class GcPauses:
    """Python's garbage-collector pauses while active, per generation: cProfile spreads a collection's time over
    whichever function allocated last, so an arm that allocates more objects per step would show its extra host time
    everywhere and nowhere. ``gc.callbacks`` times each collection instead."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._began = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.count[info["generation"]] += 1
            self.seconds[info["generation"]] += time.perf_counter() - self._began

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def per_step(self, steps: int) -> dict[str, Any]:
        """Collections and pause milliseconds per step, by generation (0, 1, 2)."""
        return {"collections": [round(c / steps, 3) for c in self.count],
                "ms": [round(t * 1e3 / steps, 3) for t in self.seconds]}  # fmt: skip


ALLOCATOR_COUNTERS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")


class AllocatorCounts:
    """The CUDA caching allocator's cudaMalloc / cudaFree calls and its free-all-and-retry events while active: a
    step that misses the cache waits in cudaFree for the device, host time that neither cProfile (it lands in
    whichever op allocated) nor a tally of launches and copies names. None without CUDA."""

    def __init__(self) -> None:
        self._before: dict[str, int] | None = None
        self._after: dict[str, int] | None = None

    @staticmethod
    def _read() -> dict[str, int] | None:
        import torch

        return torch.cuda.memory_stats() if torch.cuda.is_available() else None

    def __enter__(self) -> AllocatorCounts:
        self._before = self._read()
        return self

    def __exit__(self, *exc: object) -> None:
        self._after = self._read()

    def per_step(self, steps: int) -> dict[str, float] | None:
        return allocator_per_step(self._before, self._after, steps)


def allocator_per_step(before: dict[str, int] | None, after: dict[str, int] | None, steps: int) -> dict | None:
    """Each of ``ALLOCATOR_COUNTERS`` over the run, per step (counters absent from the stats count 0)."""
    if before is None or after is None:
        return None
    return {name: round((after.get(name, 0) - before.get(name, 0)) / steps, 3) for name in ALLOCATOR_COUNTERS}


def profiled_generate(llm: Any, prompts: list[list[int]], tokens: int) -> tuple[float, dict[FunctionKey, tuple]]:
    """One generate under cProfile: its seconds and the raw per-function stats."""
    profile = cProfile.Profile()
    began = time.perf_counter()
    profile.enable()
    timed_generate(llm, prompts, tokens)
    profile.disable()
    elapsed = time.perf_counter() - began
    return elapsed, pstats.Stats(profile).stats  # type: ignore[attr-defined]


def measure_batch(llm: Any, args: argparse.Namespace, batch: int, vocab_size: int) -> dict[str, Any]:
    rng = np.random.default_rng([args.seed, batch])

    def prompts() -> list[list[int]]:  # fresh prompts for every generate: none reuses another's prefill
        return prompt_token_ids(rng, batch, args.prompt_tokens, vocab_size)

    timed_generate(llm, prompts(), SHORT_TOKENS)  # warm-up
    t_short, t_long = (timed_generate(llm, prompts(), tokens).seconds for tokens in (SHORT_TOKENS, LONG_TOKENS))
    profiled_short, short = profiled_generate(llm, prompts(), SHORT_TOKENS)
    profiled_long, long = profiled_generate(llm, prompts(), LONG_TOKENS)
    costs = per_step_costs(short, long, LONG_TOKENS - SHORT_TOKENS)
    return {"variant": args.variant, "mode": args.mode, "batch": batch, "prompt_tokens": args.prompt_tokens,
            "step_ms": round(step_ms(t_short, t_long), 3),
            "profiled_step_ms": round(step_ms(profiled_short, profiled_long), 3),
            **cost_fields(costs)}  # fmt: skip


def pause_lines(row: dict[str, Any]) -> list[str]:
    """What a row knows of host time no function owns: GC pauses and the allocator's device calls, per step."""
    lines = []
    if row.get("gc_per_step"):
        gc_ms = row["gc_per_step"]["ms"]
        lines.append(f"- GC pauses per step: {sum(gc_ms):.3f} ms (generations 0/1/2: {'/'.join(map(str, gc_ms))})")
    if row.get("allocator_per_step"):
        counts = ", ".join(f"{name} {value}" for name, value in row["allocator_per_step"].items())
        lines.append(f"- CUDA allocator per step: {counts}")
    return [*lines, ""] if lines else []


def summary_markdown(
    rows: list[dict[str, Any]], count: int = 15, title: str = "Host time per decode step", what: str = WHAT
) -> str:
    """The top functions of every row, inclusive and self, then each ReplaySSM row's extra host time over the baseline
    row measured like it, by function, as Markdown."""
    parts = [f"# {title} (cProfile, engine in-process)", "", what, ""]
    for row in rows:
        parts += [f"## {row['variant']} {row['mode']} batch {row['batch']}: step {row['step_ms']} ms in-process "
                  f"({row['profiled_step_ms']} ms profiled)", "", *pause_lines(row)]  # fmt: skip
        for field, label in (("by_total", "inclusive"), ("by_self", "self")):
            key = "total_us" if field == "by_total" else "self_us"
            parts += [f"| function ({label}) | µs per step | calls per step |", "|---|---|---|"]
            parts += [f"| `{f['function']}` | {f[key]} | {f['calls']} |" for f in row[field][:count]] + [""]
    for row in rows:
        baseline = None if row["variant"] == "baseline" or "functions" not in row else baseline_of(row, rows)
        if baseline is None:
            continue
        slowdown = host_slowdown(row, baseline)
        scaled = (
            f"the baseline's costs scaled by {slowdown}, the host's slowdown in this run by the scheduler's and "
            "output processor's functions"
            if slowdown
            else "the host's speed in the two runs not known"
        )
        parts += [f"## {row['variant']} over the baseline, {row['mode']} batch {row['batch']}: "
                  f"{row['step_ms']} vs {baseline['step_ms']} ms per step in-process ({scaled})", ""]  # fmt: skip
        for field, label in (("total_us", "inclusive"), ("self_us", "self")):
            parts += difference_table(row, baseline, field, f"function ({label}) | extra µs per step | calls per step")
        parts += kind_differences(row, baseline)
    return "\n".join(parts)


def difference_table(row: dict[str, Any], baseline: dict[str, Any], field: str, header: str) -> list[str]:
    """Markdown: ``arm_difference`` of ``row`` over ``baseline`` as a table whose columns ``header`` names."""
    rows = [f"| `{f['function']}` | {f['extra_us']} | {f['calls']} |" for f in arm_difference(row, baseline, field)]
    return [f"| {header} |", "|---|---|---|", *rows, ""]


def kind_differences(row: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    """Markdown: ``row``'s extra inclusive host time per engine call of each kind (``by_kind``: calls around a
    prefill, decode-only calls) over the baseline's calls of that kind."""
    parts = []
    for kind, mine in row.get("by_kind", {}).items():
        theirs = baseline.get("by_kind", {}).get(kind)
        if theirs is not None:
            parts += [f"### {kind} calls ({mine['calls']} vs {theirs['calls']}): extra inclusive µs per call", ""]
            parts += difference_table(mine, theirs, "total_us", "function | extra µs per call | calls per call")
    return parts


def parser() -> argparse.ArgumentParser:
    p = engine_options(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    p.add_argument("--out", type=Path, required=True, help="JSON file to merge the rows into (+ a .md beside it)")
    return p


def in_process_engine(args: argparse.Namespace, problem: str | None) -> tuple[Any, dict[str, Any], int] | int:
    """The engine, its facts and vocabulary size, run in this process (one thread runs everything, so one cProfile
    sees every host microsecond); or the exit code after one error line: 2 for ``problem``, 1 for wrong layers."""
    if problem:
        print(f"error: {problem}")
        return 2
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # before vLLM is imported
    started = start_engine(args)
    if started is None:
        return 1
    llm, facts = started
    return llm, facts, llm.llm_engine.model_config.get_vocab_size()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    engine = in_process_engine(args, engine_problem(args) or out_problem(args.out, WHAT, args.prompt_tokens))
    if isinstance(engine, int):
        return engine
    llm, facts, vocab_size = engine
    for batch in engine_batches(llm, args):
        row = measure_batch(llm, args, batch, vocab_size) | {k: facts[k] for k in ("gpu", "vllm", "date")}
        payload = record_row(args.out, row, WHAT, command_line("replayssm_patch.gpu.host_profile", argv), facts)
        args.out.with_suffix(".md").write_text(summary_markdown(payload["rows"]))
        print(f"{args.variant} {args.mode} B={batch}: step {row['step_ms']} ms in-process, "
              f"{row['profiled_step_ms']} ms profiled; top inclusive:", flush=True)  # fmt: skip
        for f in row["by_total"][:12]:
            print(f"  {f['total_us']:10.1f} µs  {f['function']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
