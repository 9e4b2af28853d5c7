"""Does every arm start and serve as a vLLM 0.24 server on the GPU? Start-up time, KV capacity, exact lengths.

    export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1   # the offline bundle
    python3 ../shared/gpu/make-tokenizer.py MODEL_DIR                              # config.json + tokenizer
    python3 -m replayssm_patch.gpu.serve_check --model MODEL_DIR --out DIR [--mode default]   # ~6 minutes

For each variant (replayssm_patch/gpu/variants.py: baseline, ReplaySSM fp32 checkpoint, split precision) it
starts a server in its own session (setsid; stopped by PID) in the --mode compile mode, records its start-up
time and the KV capacity / max concurrency vLLM logs, then replays C streams (prompt 1024 tokens, exactly 256
output tokens) through replaybench's own replay path (bench/decode_pace.py) and counts errors and answers of
the exact length (the server's usage). Decode-step figures do not come from here: the engine-side step is
engine_step.py's, the client-side pace bench/decode_pace.py's. Writes DIR/serve_check.json and .md after
every server (a crash keeps what was done) and each server's log to DIR/<variant>.log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from replayssm_patch.gpu.variants import MODES, VARIANTS, server_flags
from replayssm_patch.plugin_site import plugin_pythonpath

STREAMS = (64,)
SERVER_FLAGS = [
    "--served-model-name", "m", "--load-format", "dummy", "--max-num-seqs", "256", "--max-model-len", "4096",
    "--gpu-memory-utilization", "0.85", "--mamba-ssm-cache-dtype", "float32",
]  # fmt: skip
LOG_FACTS = {
    "kv_cache_tokens": re.compile(r"GPU KV cache size: ([\d,]+) tokens"),
    "max_concurrency": re.compile(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"),
    "attention_block_size": re.compile(r"Setting attention block size to (\d+) tokens"),
}


@dataclass
class ServeResult:
    streams: int
    requests: int
    errors: int
    exact_lengths: int


@dataclass
class VariantResult:
    name: str
    mode: str
    startup_s: float | None = None
    facts: dict[str, float] = field(default_factory=dict)
    serves: list[ServeResult] = field(default_factory=list)
    error: str | None = None


def server_command(model: Path, port: int, name: str, mode: str) -> list[str]:
    """The `vllm serve` command line of variant `name` in compile mode `mode`."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port", str(port)]
    extra = VARIANTS[name]
    return cmd + SERVER_FLAGS + server_flags(mode) + (["--additional-config", json.dumps(extra)] if extra else [])


def start_server(model: Path, port: int, name: str, mode: str, log: Path, site: Path) -> subprocess.Popen:
    cmd = server_command(model, port, name, mode)
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


def serve_streams(url: str, streams: int, runs: Path, name: str) -> ServeResult:
    """C streams through replaybench's replay path; only whether each answer came back whole is kept here."""
    from bench.decode_pace import client_pace, pace_trace, replay_case

    pace = client_pace(replay_case(url, pace_trace(streams), workers=1, runs=runs, name=f"{name}-c{streams}"))
    return ServeResult(streams, pace.requests, pace.errors, pace.exact)


def write_report(out: Path, results: list[VariantResult]) -> None:
    (out / "serve_check.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    rows = ["| variant | mode | start-up s | KV tokens | max concurrency | streams | errors | exact lengths |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        if r.error:
            rows.append(f"| {r.name} | {r.mode} | error: {r.error} ||||||")
        for s in r.serves:
            rows.append(
                f"| {r.name} | {r.mode} | {r.startup_s} | {r.facts.get('kv_cache_tokens')} "
                f"| {r.facts.get('max_concurrency')} | {s.streams} | {s.errors} | {s.exact_lengths}/{s.requests} |"
            )
    text = "# ReplaySSM serve check (vLLM 0.24.0)\n\n" + "\n".join(rows) + "\n"
    (out / "serve_check.md").write_text(text)


def run_variant(name: str, args: argparse.Namespace, results: list[VariantResult]) -> None:
    result = VariantResult(name, args.mode)
    results.append(result)
    log = args.out / f"{name}.log"
    began = time.monotonic()
    proc = start_server(args.model, args.port, name, args.mode, log, args.out / "plugin-site")
    try:
        if not wait_healthy(proc, args.port, began + args.startup_timeout_s):
            result.error = f"server not healthy after {time.monotonic() - began:.0f}s: {last_log_line(log)}"
            return
        result.startup_s = round(time.monotonic() - began, 1)
        result.facts = log_facts(log)
        for streams in args.streams:
            url = f"http://127.0.0.1:{args.port}"
            result.serves.append(serve_streams(url, streams, args.out / "runs", name))
            write_report(args.out, results)
    finally:
        stop_server(proc)
        write_report(args.out, results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="dir with config.json and tokenizer.json")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--mode", choices=list(MODES), default="O0", help="O0: -O0 + FULL_DECODE_ONLY; default: vLLM's")
    parser.add_argument("--streams", type=int, nargs="+", default=list(STREAMS))
    parser.add_argument("--startup-timeout-s", type=float, default=200)
    args = parser.parse_args(argv)
    for needed in ("config.json", "tokenizer.json"):
        if not (args.model / needed).exists():
            print(f"error: {args.model / needed} missing; run ../shared/gpu/make-tokenizer.py {args.model} first")
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    results: list[VariantResult] = []
    for name in args.variants:
        run_variant(name, args, results)
    print((args.out / "serve_check.md").read_text())
    ok = all(
        r.error is None and all(s.errors == 0 and s.exact_lengths == s.requests for s in r.serves) for r in results
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
