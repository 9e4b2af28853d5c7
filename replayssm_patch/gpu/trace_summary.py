"""Kernel time per decode step and per layer kind, from a torch.profiler Chrome trace of a vLLM worker.

vLLM 0.24's GPU worker wraps every `execute_model` in a profiler range named
``execute_context_<reqs>(<tokens>)_generation_<reqs>(<tokens>)``. A decode step at batch B is a range with no
context request and B generation requests. Its GPU span runs from the first kernel (or copy) launched inside
the range to the first one launched by the next range, so kernels launched outside any range (the sampler
under async scheduling) and the gaps between kernels count too: every microsecond of the span is in the table,
as kernel time of one kind or as gap. Kinds come from kernel-name patterns (`KINDS`, first match wins).
The host side of a step is tallied too: the CUDA runtime and driver calls inside its range (`HOST_CALLS`), so a
blocking sync or an eager launch one arm adds per step shows as a count and as host microseconds; every call there
is also listed by exact name (`top_host_calls`), so host time in calls no kind covers (allocations, event queries)
shows too.

No torch or vLLM needed: it reads the JSON (plain or .gz) that `torch.profiler.tensorboard_trace_handler` writes.
"""

from __future__ import annotations

import ast
import bisect
import gzip
import itertools
import json
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replayssm_patch.gpu.markdown_table import table_head, table_row

STEP_RANGE = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$")
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# vLLM's recurrent-mixer ops. Mamba-2: SSU, causal conv, the SSD prefill chunks, the mixer's gated RMSNorm; Gated
# DeltaNet: the fused recurrent decode, the chunked prefill (w/u recompute, triangular solve, output), gates, l2norm
MAMBA_KERNELS = (
    r"selective_(scan|state)|causal_conv1d|chunk_(scan|state|cumsum)|state_passing|bmm_chunk|mamba|ssd_|"
    r"layer_norm_fwd_1pass|gated_delta|gdn_gating|l2norm|recompute_w_u|solve_tril|chunk_fwd_kernel_o|chunk_local_cumsum"
)


def _is_triton_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator  # @triton.jit or @triton.jit(...)
    return isinstance(target, ast.Attribute) and target.attr == "jit" and getattr(target.value, "id", None) == "triton"


def plugin_kernel_names() -> frozenset[str]:
    """The name of every Triton kernel the plugin defines (replayssm_patch/kernels), read from the source: a new
    kernel counts as ReplaySSM's in a profile without any naming rule (a profile once put three of ours in "other").
    Parsed, not imported, so that nothing imports Triton before the kernel tests choose its interpreter."""
    sources = (Path(__file__).parents[1] / "kernels").glob("*.py")
    trees = [ast.parse(source.read_text()) for source in sources]
    return frozenset(
        node.name
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and any(map(_is_triton_jit, node.decorator_list))
    )


PLUGIN_KERNELS = re.compile("^(" + "|".join(map(re.escape, sorted(plugin_kernel_names()))) + ")$")
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("replayssm", PLUGIN_KERNELS),
    ("mamba", re.compile(MAMBA_KERNELS, re.I)),
    ("attention", re.compile(r"flash|fmha|attention|attn|reshape_and_cache|paged", re.I)),
    ("gemm", re.compile(r"gemm|nvjet|cutlass|xmma|cublas|wgmma|matmul|splitk", re.I)),
)
OTHER = "other"
KIND_NAMES = (*(name for name, _ in KINDS), OTHER)
KIND_LABELS = {
    "replayssm": "ReplaySSM kernels",
    "mamba": "vLLM's recurrent mixer kernels (Mamba-2: SSU, conv, SSD, gated norm; GDN: decode, chunked prefill)",
    "attention": "attention (FlashAttention, KV-cache writes)",
    "gemm": "GEMMs (MLP and every projection, LM head)",
    OTHER: "other (norms, activations, sampler, copies)",
}
TOP_KERNELS = 15
# CUDA runtime / driver calls inside a step's host range, by what they cost the host: a sync blocks it until the GPU
# catches up (under async scheduling that forfeits the overlap of host and GPU), a launch outside a graph is host work
HOST_CALLS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("syncs", re.compile(r"Synchronize")),
    ("copies", re.compile(r"^(cudaMemcpy|cuMemcpy)")),
    ("kernel_launches", re.compile(r"^(cudaLaunchKernel|cuLaunchKernel)")),
    ("graph_launches", re.compile(r"^(cudaGraphLaunch|cuGraphLaunch)")),
)
TOP_HOST_CALLS = 12


class TraceError(ValueError):
    """The trace holds no decode step to summarise; the message says what was found instead."""


def kind_of(kernel_name: str) -> str:
    return next((name for name, pattern in KINDS if pattern.search(kernel_name)), OTHER)


@dataclass(frozen=True)
class StepRange:
    """One `execute_model` range on the host timeline (microseconds) and what it scheduled."""

    ts: float
    dur: float
    context_reqs: int
    generation_reqs: int


@dataclass(frozen=True)
class HostCall:
    name: str
    ts: float
    dur: float


@dataclass(frozen=True)
class DeviceOp:
    name: str
    ts: float
    dur: float
    correlation: int | None


def load_events(path: Path) -> list[dict[str, Any]]:
    """The trace's events; torch writes {"traceEvents": [...]}, optionally gzipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        payload = json.load(handle)
    return payload["traceEvents"] if isinstance(payload, dict) else payload


@dataclass(frozen=True)
class Trace:
    ranges: list[StepRange]
    ops: list[DeviceOp]
    launches: dict[int, float]  # correlation id -> host time of the call that launched it
    host_calls: list[HostCall]


def _parse(events: list[dict[str, Any]]) -> Trace:
    ranges, ops, launches, host_calls = [], [], {}, []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, args = e.get("cat", ""), e.get("args") or {}
        if cat in DEVICE_CATEGORIES:
            ops.append(DeviceOp(e["name"], float(e["ts"]), float(e.get("dur", 0.0)), args.get("correlation")))
        elif cat in ("cuda_runtime", "cuda_driver"):
            host_calls.append(HostCall(e.get("name", ""), float(e["ts"]), float(e.get("dur", 0.0))))
            if "correlation" in args:
                launches[args["correlation"]] = float(e["ts"])
        elif cat == "user_annotation" and (m := STEP_RANGE.match(e.get("name", ""))):
            ranges.append(StepRange(float(e["ts"]), float(e.get("dur", 0.0)), int(m[1]), int(m[3])))
    ranges.sort(key=lambda r: r.ts)
    ops.sort(key=lambda o: o.ts)
    host_calls.sort(key=lambda c: c.ts)
    return Trace(ranges, ops, launches, host_calls)


def _device_starts(ranges: list[StepRange], ops: list[DeviceOp], launches: dict[int, float]) -> list[float | None]:
    """Per range, the GPU start of the first op it launched (None if it launched nothing seen)."""
    starts: list[float | None] = [None] * len(ranges)
    begins = [r.ts for r in ranges]
    for op in ops:
        launched = launches.get(op.correlation) if op.correlation is not None else None
        if launched is None:
            continue
        i = bisect.bisect_right(begins, launched) - 1
        if i >= 0 and launched <= ranges[i].ts + ranges[i].dur:
            current = starts[i]
            starts[i] = op.ts if current is None else min(current, op.ts)
    return starts


def summarise_events(
    events: list[dict[str, Any]],
    batch: int | None = None,
    steps: int | None = None,
    mixed: bool = False,
    rows_from: int | None = None,
) -> dict:
    """Per decode step at `batch` (default: the largest generation batch seen): span, host time, time per kind
    and the top kernels. `steps` keeps only the last that many decode steps (e.g. one ring length). `rows_from`
    takes decode steps of rows_from..batch requests (under churn a replacement joins a step or two late). With
    `mixed`, the steps that prefilled some requests beside decoding others instead (churn_step.py), whatever their
    split: those run their mixers eagerly (piecewise graphs), where a plugin's extra launches cost host time."""
    trace = _parse(events)
    ranges = trace.ranges
    if not ranges:
        raise TraceError("no execute_context_..._generation_... ranges: not a vLLM 0.24 GPU-worker trace")
    starts = _device_starts(ranges, trace.ops, trace.launches)
    launched = [(r, s) for r, s in zip(ranges, starts, strict=True) if s is not None]
    # (range, gpu start, gpu end) of every range that the next launching range bounds
    spans = [(rng, start, end) for (rng, start), (_, end) in itertools.pairwise(launched)]
    batch = batch or max((r.generation_reqs for r in ranges if r.context_reqs == 0), default=0)
    if mixed:
        decode = [s for s in spans if s[0].context_reqs > 0 and s[0].generation_reqs > 0]
    else:
        fewest = batch if rows_from is None else rows_from
        decode = [s for s in spans if s[0].context_reqs == 0 and fewest <= s[0].generation_reqs <= batch]
    if steps:
        decode = decode[-steps:]
    if not decode:
        seen = sorted({(r.context_reqs, r.generation_reqs) for r in ranges})
        what = "mixed step (prefill beside decode)" if mixed else f"decode step at batch {batch}"
        raise TraceError(f"no bounded {what}; (context, generation) requests seen: {seen}")
    host = _calls_in_steps(decode, trace.host_calls)
    top_host = _heaviest(host, len(decode), TOP_HOST_CALLS)
    return {
        **_tabulate(decode, trace.ops, batch),
        "host_calls": _host_calls(host, len(decode)),
        "top_host_calls": [{"name": name, "calls": calls, "us": us} for name, us, calls in top_host],
    }


def _calls_in_steps(decode: list[tuple[StepRange, float, float]], calls: list[HostCall]) -> list[HostCall]:
    """The CUDA calls made inside the steps' host ranges: the host work the steps are charged with (the sampler's
    launch after a range closes is not)."""
    starts = [c.ts for c in calls]
    return [
        call
        for step, _, _ in decode
        for call in calls[bisect.bisect_left(starts, step.ts) : bisect.bisect_right(starts, step.ts + step.dur)]
    ]


def _host_calls(calls: list[HostCall], n: int) -> dict[str, dict[str, float]]:
    """Per step of `n`: how many of the steps' calls are of each HOST_CALLS kind, and their host µs."""
    count: dict[str, int] = defaultdict(int)
    host_us: dict[str, float] = defaultdict(float)
    for call in calls:
        kind = next((name for name, pattern in HOST_CALLS if pattern.search(call.name)), None)
        if kind is not None:
            count[kind] += 1
            host_us[kind] += call.dur
    return {name: {"per_step": round(count[name] / n, 2), "us": round(host_us[name] / n, 2)} for name, _ in HOST_CALLS}


def _heaviest(events: Iterable[HostCall | DeviceOp], n: int, limit: int) -> list[tuple[str, float, float]]:
    """(name, µs, count) per step of `n` of the `limit` names that took the most time: one ranking for the GPU's
    kernels and the host's CUDA calls."""
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for e in events:
        total[e.name] += e.dur
        count[e.name] += 1
    top = sorted(total, key=total.__getitem__, reverse=True)[:limit]
    return [(name, round(total[name] / n, 2), round(count[name] / n, 2)) for name in top]


def _tabulate(decode: list[tuple[StepRange, float, float]], ops: list[DeviceOp], batch: int) -> dict:
    n = len(decode)
    op_starts = [o.ts for o in ops]
    per_kind: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    spanned = [
        op
        for _, start, end in decode
        for op in ops[bisect.bisect_left(op_starts, start) : bisect.bisect_left(op_starts, end)]
    ]
    for op in spanned:
        kind = kind_of(op.name)
        per_kind[kind] += op.dur
        calls[kind] += 1
    span_us = statistics.fmean(end - start for _, start, end in decode)
    busy_us = sum(per_kind.values()) / n
    kinds = {
        k: {"label": KIND_LABELS[k], "us": round(per_kind[k] / n, 2), "launches": round(calls[k] / n, 2),
            "share": round(per_kind[k] / n / span_us, 4) if span_us else None}
        for k in KIND_NAMES
    }  # fmt: skip
    return {
        "batch": batch,
        "steps": n,
        "span_us": round(span_us, 2),
        "kernel_us": round(busy_us, 2),
        "gap_us": round(span_us - busy_us, 2),
        "host_us": round(statistics.fmean(r.dur for r, _, _ in decode), 2),
        "kinds": kinds,
        "top_kernels": [
            {"name": name[:160], "kind": kind_of(name), "us": us, "calls": c}
            for name, us, c in _heaviest(spanned, n, TOP_KERNELS)
        ],
    }


def summarise_trace(
    path: Path, batch: int | None = None, steps: int | None = None, mixed: bool = False, rows_from: int | None = None
) -> dict:
    return summarise_events(load_events(path), batch, steps, mixed, rows_from)


def _label(row: dict[str, Any]) -> str:
    """A row's variant (and churn_step's step kind), or its speculative-decoding arm and acceptance length (spec_step's
    profile rows)."""
    if "arm" not in row:
        return row["variant"] + (f" ({row['step_kind']} steps)" if "step_kind" in row else "")
    al = row.get("acceptance_length_configured")
    return row["arm"] if al is None else f"{row['arm']} (AL {al:g})"


def markdown(rows: list[dict[str, Any]]) -> str:
    """One table of time per kind (µs per decode step) for every summarised row, the CUDA calls per step by kind,
    then each row's CUDA calls by name and its top kernels."""
    head = ["variant", "mode", "batch", "steps", "span µs", *KIND_NAMES, "gap µs", "host µs"]
    lines = table_head(head)
    for r in rows:
        kinds = [f"{r['kinds'][k]['us']:.1f}" for k in KIND_NAMES]
        cells = [_label(r), r["mode"], r["batch"], r["steps"], f"{r['span_us']:.1f}", *kinds,
                 f"{r['gap_us']:.1f}", f"{r['host_us']:.1f}"]  # fmt: skip
        lines.append(table_row(cells))
    lines += ["", "Kinds: " + "; ".join(f"{k} = {KIND_LABELS[k]}" for k in KIND_NAMES) + "."]
    lines += ["", "CUDA calls per decode step inside its host range (count, host µs):", ""]
    calls = [name for name, _ in HOST_CALLS]
    lines += [*table_head(["variant", "mode", "batch", *calls])]
    for r in rows:
        tally = r.get("host_calls") or {}  # rows summarised before the tally existed have none
        cells = [f"{tally[c]['per_step']} ({tally[c]['us']:.1f})" if c in tally else "–" for c in calls]
        lines.append(table_row([_label(r), r["mode"], r["batch"], *cells]))
    for r in [r for r in rows if "top_host_calls" in r]:  # rows summarised before the list existed have none
        lines += ["", f"Host CUDA calls, {_label(r)} {r['mode']} batch {r['batch']} (per step):", ""]
        lines += ["| call | calls | µs |", "|---|---|---|"]
        lines += [f"| `{c['name']}` | {c['calls']} | {c['us']} |" for c in r["top_host_calls"]]
    for r in rows:
        lines += ["", f"Top kernels, {_label(r)} {r['mode']} batch {r['batch']} (µs and calls per step):", ""]
        lines += ["| kernel | kind | µs | calls |", "|---|---|---|---|"]
        lines += [f"| `{k['name']}` | {k['kind']} | {k['us']} | {k['calls']} |" for k in r["top_kernels"]]
    return "\n".join(lines) + "\n"
