"""End-to-end check of the plugin on an H200: real vLLM 0.24 servers with and without ReplaySSM.

    export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1   # the offline bundle
    python3 ../shared/gpu/make-tokenizer.py MODEL_DIR                              # config.json + tokenizer
    python3 -m replayssm_patch.gpu.serve_check --model MODEL_DIR --out DIR         # about 8 minutes

For each variant (baseline fp32 state, ReplaySSM fp32 checkpoint, ReplaySSM split precision) it starts
a server in its own session (setsid; stopped by PID), records start-up time and the KV capacity / max
concurrency vLLM logs, then runs a closed loop at batch 64/128/256: C concurrent streams, prompt 1024
tokens, exactly 256 output tokens. The median inter-token gap is the decode step time. Writes
DIR/serve_check.json and DIR/serve_check.md after every measurement (a crash keeps what was done) and
each server's log to DIR/<variant>.log. Run it from the checkout root so the plugin is importable.

    python3 -m replayssm_patch.gpu.serve_check --model MODEL_DIR --out DIR --attach PORT --name NAME --log LOG

measures a server that is already running (started by tools/gpu/session.sh, say, so servers on two GPUs
can start in parallel) under the variant name NAME, reading its facts from LOG; results add to DIR's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from replayssm_patch.plugin_site import plugin_pythonpath

PROMPT_TOKENS, OUTPUT_TOKENS = 1024, 256
CONCURRENCIES = (64, 128, 256)
SERVER_FLAGS = [
    "--served-model-name", "m", "--load-format", "dummy", "--max-num-seqs", "256", "--max-model-len", "4096",
    "--gpu-memory-utilization", "0.85", "--mamba-ssm-cache-dtype", "float32", "-O0",
    "-cc", '{"cudagraph_mode":"FULL_DECODE_ONLY"}',
]  # fmt: skip
VARIANTS = {
    "baseline_fp32": None,
    "replayssm_fp32": {"replayssm": {"enable": True, "buffer_len": 16, "split_precision": False}},
    "replayssm_split": {"replayssm": {"enable": True, "buffer_len": 16, "split_precision": True}},
}
LOG_FACTS = {
    "kv_cache_tokens": re.compile(r"GPU KV cache size: ([\d,]+) tokens"),
    "max_concurrency": re.compile(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"),
    "attention_block_size": re.compile(r"Setting attention block size to (\d+) tokens"),
}


@dataclass
class LoadResult:
    concurrency: int
    requests: int
    errors: int
    exact_lengths: int
    itl_p50_ms: float | None
    itl_p90_ms: float | None
    output_tokens_per_s: float
    wall_s: float


@dataclass
class VariantResult:
    name: str
    additional_config: dict | None
    startup_s: float | None = None
    facts: dict[str, float] = field(default_factory=dict)
    loads: list[LoadResult] = field(default_factory=list)
    error: str | None = None


def start_server(model: Path, port: int, extra: dict | None, log: Path, site: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port", str(port)]
    cmd += SERVER_FLAGS + (["--additional-config", json.dumps(extra)] if extra else [])
    env = {**os.environ, "PYTHONPATH": f"{plugin_pythonpath(site)}:{os.environ.get('PYTHONPATH', '')}"}
    with log.open("w") as sink:
        return subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group (API server, engine core, workers), then SIGKILL what is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):  # children that outlived the leader
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_healthy(proc: subprocess.Popen, port: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                if reply.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(2)
    return False


def log_facts(log: Path) -> dict[str, float]:
    text = log.read_text(errors="replace")
    found = {}
    for name, pattern in LOG_FACTS.items():
        hits = pattern.findall(text)
        if hits:
            found[name] = float(hits[-1].replace(",", ""))
    return found


def last_log_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    refused = [line for line in lines if "ReplaySSM refused" in line]
    return (refused or lines or ["(empty log)"])[-1][-400:]


async def one_stream(session, url: str, prompt: str) -> tuple[list[float], int | None, bool]:
    """Arrival times of streamed chunks, completion_tokens from usage, ok flag."""
    body = {
        "model": "m", "prompt": prompt, "max_tokens": OUTPUT_TOKENS, "min_tokens": OUTPUT_TOKENS,
        "ignore_eos": True, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    arrivals: list[float] = []
    tokens = None
    async with session.post(url, json=body) as reply:
        if reply.status != 200:
            return arrivals, None, False
        async for raw in reply.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                arrivals.append(time.perf_counter())
    return arrivals, tokens, True


def prompt_of(i: int) -> str:
    """Exactly PROMPT_TOKENS tokens with make-tokenizer.py's word-level tokenizer; distinct per stream."""
    return " ".join(f"t{(97 * i + 13 * j) % 30000 + 10}" for j in range(PROMPT_TOKENS))


async def closed_loop(port: int, concurrency: int) -> LoadResult:
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/completions"
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        prompts = [prompt_of(i) for i in range(concurrency)]
        start = time.perf_counter()
        outcomes = await asyncio.gather(*(one_stream(session, url, p) for p in prompts), return_exceptions=True)
        wall = time.perf_counter() - start
    gaps, errors, exact, produced = [], 0, 0, 0
    for outcome in outcomes:
        if isinstance(outcome, BaseException) or not outcome[2]:
            errors += 1
            continue
        arrivals, tokens, _ = outcome
        gaps += [b - a for a, b in itertools.pairwise(arrivals)]
        exact += tokens == OUTPUT_TOKENS
        produced += tokens or 0
    quantiles = statistics.quantiles(gaps, n=10) if len(gaps) >= 10 else None
    return LoadResult(
        concurrency=concurrency, requests=concurrency, errors=errors, exact_lengths=exact,
        itl_p50_ms=round(statistics.median(gaps) * 1e3, 2) if gaps else None,
        itl_p90_ms=round(quantiles[-1] * 1e3, 2) if quantiles else None,
        output_tokens_per_s=round(produced / wall, 1), wall_s=round(wall, 1),
    )  # fmt: skip


def write_report(out: Path, results: list[VariantResult]) -> None:
    (out / "serve_check.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    base = {lr.concurrency: lr.itl_p50_ms for r in results if r.name == "baseline_fp32" for lr in r.loads}
    rows = ["| variant | start-up s | KV tokens | max concurrency | batch | ITL p50 ms | speed-up | ITL p90 ms "
            "| tok/s | errors | exact lengths |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        if r.error:
            rows.append(f"| {r.name} | error: {r.error} |||||||||")
        for lr in r.loads:
            ref = base.get(lr.concurrency)
            speedup = f"{ref / lr.itl_p50_ms:.2f}x" if ref and lr.itl_p50_ms else "-"
            rows.append(
                f"| {r.name} | {r.startup_s} | {r.facts.get('kv_cache_tokens')} | {r.facts.get('max_concurrency')} "
                f"| {lr.concurrency} | {lr.itl_p50_ms} | {speedup} | {lr.itl_p90_ms} | {lr.output_tokens_per_s} "
                f"| {lr.errors} | {lr.exact_lengths}/{lr.requests} |"
            )
    text = "# ReplaySSM serve check (vLLM 0.24.0, H200)\n\n" + "\n".join(rows) + "\n"
    (out / "serve_check.md").write_text(text)


def measure_loads(result: VariantResult, port: int, log: Path, args: argparse.Namespace, results: list) -> None:
    """The server's capacity facts from its log, then the closed loop at every batch size (report after each)."""
    result.facts = log_facts(log)
    write_report(args.out, results)
    for concurrency in args.concurrency:
        if time.monotonic() > args.deadline:
            result.error = f"skipped batch {concurrency}: time budget spent"
            break
        result.loads.append(asyncio.run(closed_loop(port, concurrency)))
        write_report(args.out, results)


def run_variant(name: str, extra: dict | None, args: argparse.Namespace, results: list[VariantResult]) -> None:
    result = VariantResult(name, extra)
    results.append(result)
    log = args.out / f"{name}.log"
    began = time.monotonic()
    proc = start_server(args.model, args.port, extra, log, args.out / "plugin-site")
    try:
        if not wait_healthy(proc, args.port, began + args.startup_timeout_s):
            result.error = f"server not healthy after {time.monotonic() - began:.0f}s: {last_log_line(log)}"
            return
        result.startup_s = round(time.monotonic() - began, 1)
        measure_loads(result, args.port, log, args, results)
    finally:
        stop_server(proc)
        write_report(args.out, results)


def attach_variant(args: argparse.Namespace, results: list[VariantResult]) -> None:
    """Measure an already running server as variant ``args.name``, replacing an earlier result of that name."""
    results[:] = [r for r in results if r.name != args.name]
    result = VariantResult(args.name, None)
    results.append(result)
    measure_loads(result, args.attach, args.log, args, results)


def saved_results(out: Path) -> list[VariantResult]:
    """Results an earlier (attach) run left in ``out``, so several servers' measurements share one report."""
    saved = out / "serve_check.json"
    if not saved.exists():
        return []
    return [
        VariantResult(**{**r, "loads": [LoadResult(**lr) for lr in r["loads"]]}) for r in json.loads(saved.read_text())
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="dir with config.json and tokenizer.json")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCIES))
    parser.add_argument("--startup-timeout-s", type=float, default=200)
    parser.add_argument("--budget-s", type=float, default=530, help="stop starting new measurements after this")
    parser.add_argument("--attach", type=int, metavar="PORT", help="measure the server already on PORT instead")
    parser.add_argument("--name", help="--attach: variant name in the report (baseline_fp32 is the reference)")
    parser.add_argument("--log", type=Path, help="--attach: that server's log, for its KV capacity lines")
    args = parser.parse_args(argv)
    if args.attach is not None and (args.name is None or args.log is None):
        print("error: --attach needs --name (the variant) and --log (that server's log file)")
        return 2
    for needed in ("config.json", "tokenizer.json"):
        if not (args.model / needed).exists():
            print(f"error: {args.model / needed} missing; run ../shared/gpu/make-tokenizer.py {args.model} first")
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    args.deadline = time.monotonic() + args.budget_s
    results = saved_results(args.out)
    if args.attach is not None:
        attach_variant(args, results)
    else:
        for name in args.variants:
            run_variant(name, VARIANTS[name], args, results)
    print((args.out / "serve_check.md").read_text())
    return 0 if all(r.error is None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
