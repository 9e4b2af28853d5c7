"""What the GPU kernel benchmarks (``kernel_bench`` for Mamba-2, ``gdn_kernel_bench`` for Gated DeltaNet) share.

Device choice (CPU only under ``--smoke``, through Triton's interpreter), the timing method (CUDA graphs of
back-to-back calls, CUDA events), one timing-table row with its bytes and share of the card's measured HBM peak,
the registers ptxas gave the compiled kernels, and the report writer that rewrites JSON + Markdown after every section.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import math
import os
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar, NamedTuple, Self

NOMINAL_HBM_BYTES_PER_S = 4.3e12  # the H200 peak of research/replayssm_perf_review.md: the CPU smoke runs' stand-in
HBM_PROBE_BYTES = 1 << 30
TARGET_REL_ERR = 1e-4  # fp32 checkpoint vs the baseline, relative to the largest |value|


@dataclass(frozen=True)
class BenchPlan:
    """What every kernel benchmark's plan holds besides its layer's shapes: the ring, the equivalence run and how
    hard ``seconds_per_call`` works. Each benchmark's Plan adds its shapes (and sweeps) to these."""

    buffer_len: int = 16
    eq_batch: int = 256
    eq_steps: int = 2000
    # 1 to 32: the launches' latency, which bytes do not show, and where the native regime ends (``native_max_batch``)
    batches: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256)
    warmup: int = 3
    graph_calls: int = 20  # calls captured per CUDA graph
    repeats: int = 5  # graph replays timed


def pick_device(smoke: bool) -> str | None:
    """The device to run on: cuda if a GPU is visible, else cpu under --smoke (Triton interpreter), else None."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if not smoke:
        return None
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernel modules are imported, which happens after this
    return "cpu"


def vllm_kernel(module: str, name: str, label: str) -> tuple[Callable[..., Any] | None, str]:
    """vLLM's ``module.name`` (a benchmark's baseline) and a note naming it with vLLM's version; without it (no vLLM,
    or renamed) None and why, so the fp64 reference recurrence stands in."""
    try:
        fn = getattr(importlib.import_module(module), name)
    except Exception as exc:
        return None, f"fp64 reference recurrence (vLLM {label} not importable: {exc!r})"
    import vllm

    return fn, f"vllm {vllm.__version__} {label}"


def bench_meta(plan: BenchPlan, device: str) -> dict[str, Any]:
    """The plan (a dataclass) and the software and device it ran on."""
    import torch
    import triton

    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)"
    return {
        "plan": asdict(plan),
        "device": gpu,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "hbm_peak_bytes_per_s": hbm_peak_bytes_per_s(device),
    }


@functools.cache
def hbm_peak_bytes_per_s(device: str) -> float:
    """The bandwidth a "share of HBM" is taken against, each card its own (an H100's shares are not against an
    H200's peak): on CUDA the faster of a 1 GiB read-only reduction and a 1 GiB device-to-device copy, timed like
    the kernels (the copy alone read 2.72 TB/s on an H200 whose verify kernels moved 3.4: its reads and writes
    contend); on CPU the H200's figure, nominal."""
    if device != "cuda":
        return NOMINAL_HBM_BYTES_PER_S
    import torch

    source = torch.empty(HBM_PROBE_BYTES // 4, dtype=torch.float32, device=device).fill_(1.0)
    target, total = torch.empty_like(source), torch.empty((), dtype=torch.float32, device=device)
    read_secs = seconds_per_call(lambda: torch.sum(source, dim=0, out=total), BenchPlan(), device)
    copy_secs = seconds_per_call(lambda: target.copy_(source), BenchPlan(), device)
    return max(HBM_PROBE_BYTES / read_secs, 2 * HBM_PROBE_BYTES / copy_secs)


class Report:
    """Collects section results; rewrites DIR/STEM.json + .md after each so partial runs still leave a record."""

    def __init__(self, out_dir: Path, stem: str, data: dict[str, Any], render: Callable[[dict[str, Any]], str]) -> None:
        self.json_path, self.md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
        self.stem, self.data, self.render = stem, data, render

    def log(self, message: str) -> None:
        print(f"[{self.stem}] {message}", flush=True)

    def section(self, name: str, run: Callable[[], dict[str, Any]]) -> None:
        self.log(f"{name} ...")
        started = time.perf_counter()
        try:
            result = {"status": "ok", **run()}
        except Exception as exc:  # one broken section must not lose the others
            result = {"status": "error", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            self.log(f"{name} FAILED: {result['error']}")
        result["seconds"] = round(time.perf_counter() - started, 1)
        self.data[name] = result
        self.json_path.write_text(json.dumps(self.data, indent=2, default=str))
        self.md_path.write_text(self.render(self.data))
        self.log(f"{name} {result['status']} in {result['seconds']} s")


def probe_problem(note: str, call: Callable[[], Any], error_of: Callable[[], float]) -> str | None:
    """Why vLLM's kernel cannot be a benchmark's baseline (a 2-row probe call failed, or disagreed with the fp64
    recurrence by more than 1e-2, which also catches rows it skipped), as the fallback's note; None when it can."""
    try:
        call()
    except Exception as exc:
        return f"fp64 reference recurrence ({note} failed on a probe call: {exc!r})"
    error = error_of()
    if not error <= 1e-2:
        return f"fp64 reference recurrence ({note} disagreed on a probe call: error {error})"
    return None


@dataclass(frozen=True)
class VllmBaseline:
    """A kernel bench's vLLM kernel (``fn``, None when unusable) and the note naming it or why the fp64 reference
    recurrence stands in. A family's subclass names the kernel (``SOURCE``: module, function, label) and probes it."""

    fn: Callable[..., Any] | None
    note: str
    SOURCE: ClassVar[tuple[str, str, str]]

    @classmethod
    def load(cls) -> Self:
        return cls(*vllm_kernel(*cls.SOURCE))

    def checked(self, plan: Any, device: str) -> Self:
        """This baseline if one call on a 2-row batch works and agrees with the fp64 recurrence, else the fallback
        saying why."""
        if self.fn is None:
            return self
        problem = probe_problem(self.note, *self.probe(plan, device))
        return self if problem is None else type(self)(None, problem)

    def probe(self, plan: Any, device: str) -> tuple[Callable[[], Any], Callable[[], float]]:
        """The 2-row probe call and its error against the fp64 recurrence (the family's shapes)."""
        raise NotImplementedError


class BenchRun(NamedTuple):
    """What a benchmark's main works with once its options are read."""

    args: argparse.Namespace
    plan: BenchPlan
    device: str
    report: Report


def open_bench(
    argv: list[str] | None,
    description: str,
    stem: str,
    plans: tuple[BenchPlan, BenchPlan],
    render: Callable[[dict[str, Any]], str],
    sweep_help: str,
) -> BenchRun | None:
    """Both benchmarks' options (--out, --smoke, --steps, --no-sweep), the plan (``plans`` = full, smoke; --steps
    sets its equivalence steps), the device and the report holding the meta; None after one error line when no GPU
    is visible without --smoke."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True, help=f"directory for {stem}.json / .md")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, any device (CPU: Triton interpreter)")
    parser.add_argument("--steps", type=int, help="equivalence steps (default 2000)")
    parser.add_argument("--no-sweep", action="store_true", help=sweep_help)
    args = parser.parse_args(argv)
    plan = plans[1] if args.smoke else plans[0]
    if args.steps:
        plan = replace(plan, eq_steps=args.steps)
    device = pick_device(args.smoke)
    if device is None:
        print("error: no CUDA GPU visible; run the full benchmark on the GPU host, or use --smoke on CPU")
        return None
    args.out.mkdir(parents=True, exist_ok=True)
    return BenchRun(args, plan, device, Report(args.out, stem, {"meta": bench_meta(plan, device)}, render))


def report_head(title: str, meta: dict[str, Any]) -> list[str]:
    """The first lines of a benchmark's Markdown: what ran it, and against which baseline."""
    return [
        f"# {title}",
        "",
        f"Device: {meta.get('device')}; torch {meta.get('torch')}, triton {meta.get('triton')}.",
        f"HBM peak: {meta.get('hbm_peak_bytes_per_s', NOMINAL_HBM_BYTES_PER_S) / 1e12:.2f} TB/s (the faster of a "
        "read-only reduction and a copy on this card; on CPU the H200's, nominal): every share of HBM below is of it.",
        f"Baseline: {meta.get('baseline', 'n/a')}.",
        "",
    ]


def section_markdown(
    data: dict[str, Any], name: str, title: str, body: Callable[[dict[str, Any]], list[str]]
) -> list[str]:
    """One report section's Markdown: nothing when it did not run, its error when it failed, else ``body``'s lines."""
    section = data.get(name)
    if not section:
        return []
    return [f"## {title}", "", *([f"FAILED: {section['error']}", ""] if section["status"] != "ok" else body(section))]


def seconds_per_call(call: Callable[[], Any], effort: BenchPlan, device: str) -> float:
    """Mean seconds per call: on CUDA a graph of `graph_calls` back-to-back calls, replayed and event-timed."""
    import torch

    for _ in range(effort.warmup):  # compiles the Triton kernel outside any capture
        call()
    if device != "cuda":
        started = time.perf_counter()
        for _ in range(effort.repeats):
            call()
        return (time.perf_counter() - started) / effort.repeats
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(effort.graph_calls):
            call()
    graph.replay()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(effort.repeats):
        graph.replay()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3 / (effort.repeats * effort.graph_calls)


def time_shapes(
    bench: str, label: str, calls: dict[str, Callable[[], Any]], effort: BenchPlan, device: str
) -> dict[str, float]:
    """µs per call of every named launch shape; a shape the compiler rejects is reported and left out, so that one
    bad shape does not end a sweep."""
    timings = {}
    for name, call in calls.items():
        try:
            timings[name] = seconds_per_call(call, effort, device) * 1e6
        except Exception as exc:
            print(f"[{bench}]   sweep {label} {name} failed: {exc!r}", flush=True)
    return timings


def ranked_shapes(timings: dict[str, float]) -> str:
    """A sweep's timings, fastest first, for the Markdown reports."""
    return ", ".join(f"{name} {us:.1f}" for name, us in sorted(timings.items(), key=lambda kv: kv[1]))


def timing_method(device: str) -> str:
    if device == "cuda":
        return "CUDA graph of back-to-back calls, timed with CUDA events over several replays"
    return "wall clock on CPU under the Triton interpreter (meaningless as speed; checks the code path only)"


def timing_row(
    batch: int, kernel: str, secs: float, nbytes: float, base_secs: float, peak_bytes_per_s: float
) -> dict[str, Any]:
    """One timed kernel at one batch: time, bytes it must move, their rate and share of the card's HBM peak, the
    speed-up over the baseline with an fp32 state (NaN without one)."""
    return {
        "batch": batch,
        "kernel": kernel,
        "us": secs * 1e6,
        "bytes": nbytes,
        "GB_per_s": nbytes / secs / 1e9,
        "hbm_share": nbytes / secs / peak_bytes_per_s,
        "speedup_vs_baseline_fp32": base_secs / secs,
    }


def paged_tensors(shapes: Any, dtypes: Any, slots: int, device: str) -> list[Any]:
    """A layer's state tensors as views into one page per slot (vLLM's MambaSpec packing), the page the sum of
    their sizes, so a benchmark reads and writes the cache as the plugin does."""
    import torch

    from replayssm_patch.gpu.layer_check import paged_state_tensors

    pairs = zip(shapes, dtypes, strict=True)
    page = sum(math.prod(shape) * torch.empty((), dtype=dt).element_size() for shape, dt in pairs)
    return paged_state_tensors(SimpleNamespace(shapes=shapes, dtypes=dtypes, page_size_bytes=page), slots, device)


class TimedCalls:
    """One batch's timed calls by name, in order; a call that fails is logged and left out, keeping the others."""

    def __init__(self, stem: str, effort: BenchPlan, device: str, batch: int) -> None:
        self.stem, self.effort, self.device, self.batch = stem, effort, device, batch
        self.measured: dict[str, tuple[float, float]] = {}  # name -> (seconds, bytes it must move)

    def measure(self, name: str, call: Callable[[], Any], nbytes: float, per: int = 1) -> None:
        """Time ``call``; ``per``: how many of the row's units one call runs (its time is given per unit)."""
        try:
            self.measured[name] = (seconds_per_call(call, self.effort, self.device) / per, nbytes)
        except Exception as exc:  # keep the other rows
            print(f"[{self.stem}]   {name} failed: {exc!r}", flush=True)

    def rows(self, baseline: str) -> list[dict[str, Any]]:
        """The timing rows, each with its speed-up over the call named ``baseline`` (NaN when it did not run)."""
        base, peak = self.measured.get(baseline, (math.nan, 0))[0], hbm_peak_bytes_per_s(self.device)
        return [timing_row(self.batch, n, secs, nbytes, base, peak) for n, (secs, nbytes) in self.measured.items()]


def error_summary(per_step: Any) -> dict[str, Any]:
    """The equivalence figures of a [steps, 2] tensor of per-step (max-relative, normwise) output errors."""
    import torch

    return {
        "max_rel_err": per_step[:, 0].max().item(),
        "worst_step": int(per_step[:, 0].argmax()),
        "max_rel_err_norm": per_step[:, 1].max().item(),
        "last_step_rel_err": per_step[-1, 0].item(),
        "finite": bool(torch.isfinite(per_step).all()),
    }


def timing_table(rows: Iterable[dict[str, Any]]) -> list[str]:
    """Markdown lines of ``timing_row`` rows."""
    lines = [
        "| batch | kernel | us | MB moved | GB/s | share of HBM peak | speedup vs baseline fp32 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['kernel']} | {r['us']:.1f} | {r['bytes'] / 1e6:.1f} | "
            f"{r['GB_per_s']:.0f} | {r['hbm_share']:.0%} | {speedup(r['speedup_vs_baseline_fp32'])} |"
        )
    return lines


def speedup(ratio: float) -> str:
    return "n/a" if math.isnan(ratio) else f"{ratio:.2f}x"


def compiled_registers(kernels: Iterable[Any]) -> list[dict[str, Any]]:
    """Registers and spills of every specialisation of ``kernels`` this run compiled (what ptxas gave the GPU;
    nothing under the interpreter)."""
    found = []
    for kernel in kernels:
        for cache in getattr(kernel, "device_caches", {}).values():
            for compiled in cache[0].values():
                constants = {k: v for k, v in compiled.src.constants.items() if isinstance(v, (bool, int, str))}
                found.append({
                    "kernel": kernel.__name__, "num_warps": compiled.metadata.num_warps,
                    "registers": getattr(compiled, "n_regs", None), "spills": getattr(compiled, "n_spills", None),
                    "constexprs": {str(k): v for k, v in constants.items()},
                })  # fmt: skip
    return found


def registers_table(registers: list[dict[str, Any]]) -> list[str]:
    """Markdown lines of ``compiled_registers`` (none when the list is empty)."""
    if not registers:
        return []
    lines = ["| kernel | warps | registers | spills | constexprs |", "| --- | --- | --- | --- | --- |"]
    for r in registers:
        shown = {k: v for k, v in r["constexprs"].items() if k.isupper() or k.startswith("BLOCK")}
        lines.append(f"| {r['kernel']} | {r['num_warps']} | {r['registers']} | {r['spills']} | {shown} |")
    return [*lines, ""]


def native_max_batch(rows: list[dict[str, Any]], baseline_kernel: str, ring_kernel: str) -> int:
    """The plugin's native batches (``launch_config``): the largest timed batch up to which vLLM's kernel
    (``baseline_kernel``, fp32 state) measured faster than the ring's decode step (``ring_kernel``) at every batch
    timed, 0 if not even at the smallest (or without a baseline row)."""
    us = {(row["batch"], row["kernel"]): row["us"] for row in rows}
    best = 0
    for batch in sorted({row["batch"] for row in rows}):
        vllm, ring = us.get((batch, baseline_kernel)), us.get((batch, ring_kernel))
        if vllm is None or ring is None or vllm >= ring:
            break
        best = batch
    return best
