"""Decode pace: does replaybench's client see the engine's true decode step? Against `serve-sim`, where it is known.

Closed loop of 1, 64 and 256 streams that start together (prompt 1024 tokens, exactly 256 output tokens),
replayed through `replaybench replay` with 1 and 4 workers and read back through the analysis
(bench/decode_pace.py, the same code the H200 run uses against vLLM). The truth comes from the same
simulated engine (scheduler + cost model, same settings as the server) driven in virtual time, with no clock
and no HTTP:
- true step: the GPU method of replayssm_patch/gpu/engine_step.py, (t(16 + N) - t(16)) / N, N = 256;
- true TPOT: each request's (last - first token) / (N - 1) for exactly the replayed load, averaged.
The client's window pace compares with the true step, its TPOT with the true TPOT; 1.00 is a perfect client.

`python -m bench.bench_decode_pace --quick --out DIR` runs 1 and 64 streams with 64 output tokens (under a
minute) into DIR/bench_decode_pace-quick.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from bench.bench_sim import sim_server
from bench.decode_pace import (
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    client_pace,
    pace_trace,
    ratio,
    replay_case,
)
from bench.report import RESULTS_DIR, write_results
from harness.sim.commands import DEFAULT_MODEL
from harness.sim.engine_core import EngineCore
from harness.sim.engine_spec import EngineSpec, build_spec
from harness.sim.state_policy import StatePolicy
from harness.sim.virtual import RequestSpec, VirtualRun, run_virtual
from replayssm_patch.gpu.engine_step import SHORT_TOKENS, step_ms

STREAMS, WORKERS = (1, 64, 256), (1, 4)
QUICK_STREAMS, QUICK_OUTPUT_TOKENS = (1, 64), 64
MAX_NUM_SEQS = 256


def engine_spec() -> EngineSpec:
    """The simulated engine serve-sim runs with its defaults (Nemotron-H-8B, H200, baseline fp32 state)."""
    return build_spec(DEFAULT_MODEL, "h200", StatePolicy(), max_num_seqs=MAX_NUM_SEQS)


def virtual_load(spec: EngineSpec, streams: int, prompt_tokens: int, output_tokens: int) -> VirtualRun:
    requests = [RequestSpec(f"pace-{i}", 0.0, prompt_tokens, output_tokens) for i in range(streams)]
    return run_virtual(EngineCore(spec), requests)


def true_step_ms(spec: EngineSpec, streams: int, prompt_tokens: int, output_tokens: int) -> float:
    """engine_step.py's two-length method on the virtual engine: prefill cancels, decode steps remain."""
    ends = []
    for tokens in (SHORT_TOKENS, SHORT_TOKENS + output_tokens):
        run = virtual_load(spec, streams, prompt_tokens, tokens)
        ends.append(run.step_starts[-1] + run.step_durations[-1])
    return step_ms(ends[0], ends[1], SHORT_TOKENS, SHORT_TOKENS + output_tokens)


def true_tpot_ms(spec: EngineSpec, streams: int, prompt_tokens: int, output_tokens: int) -> float:
    run = virtual_load(spec, streams, prompt_tokens, output_tokens)
    per_request = [(t[-1] - t[0]) / (len(t) - 1) for t in (run.token_times(r) for r in run.requests)]
    return statistics.fmean(per_request) * 1e3


def measure(streams_levels: tuple[int, ...], output_tokens: int, tmp: Path) -> list[dict[str, object]]:
    spec = engine_spec()
    rows = []
    for streams in streams_levels:
        step = round(true_step_ms(spec, streams, PROMPT_TOKENS, output_tokens), 3)
        tpot = round(true_tpot_ms(spec, streams, PROMPT_TOKENS, output_tokens), 3)
        trace = pace_trace(streams, PROMPT_TOKENS, output_tokens)
        with sim_server(tmp, "--max-num-seqs", str(MAX_NUM_SEQS)) as server:
            server.wait_ready()
            for workers in WORKERS:
                pace = client_pace(replay_case(server.base_url, trace, workers, tmp, f"c{streams}-w{workers}"))
                rows.append(
                    {
                        "streams": streams,
                        "workers": workers,
                        "true_step_ms": step,
                        "client_window_ms": pace.window_step_ms,
                        "window_vs_true": ratio(pace.window_step_ms, step),
                        "true_tpot_ms": tpot,
                        "client_tpot_ms": pace.tpot_mean_ms,
                        "tpot_vs_true": ratio(pace.tpot_mean_ms, tpot),
                        "client_tpot_p50_ms": pace.tpot_p50_ms,
                        "exact": f"{pace.exact}/{pace.requests}",
                        "errors": pace.errors,
                        "send_lag_p99_ms": pace.lag_p99_ms,
                    }
                )
                print(rows[-1], flush=True)
    return rows


def notes(output_tokens: int) -> str:
    return " ".join(
        [
            f"Each case: C requests at t = 0, prompt {PROMPT_TOKENS} tokens, exactly {output_tokens} output tokens",
            "(ignore_eos), replayed with `replaybench replay` (1 or 4 workers) against a fresh serve-sim",
            "(nemotron-h-8b",
            "on a simulated H200, baseline fp32 state, --max-num-seqs 256).",
            "client_window_ms = pure-decode window (every stream has its first token, none has finished) / tokens",
            "per stream in it; true_step_ms = the virtual engine's (t(16+N) - t(16)) / N, the method of",
            "replayssm_patch/gpu/engine_step.py. client_tpot_ms = mean of the analysis' per-request TPOT;",
            "true_tpot_ms = the same mean for the same load in virtual time. TPOT exceeds the step at 64-256",
            "streams because early requests decode beside later ones' chunked prefill (mixed, longer steps).",
            "Send lag is high by design: every request of a case is due at the same instant.",
            "Client and server share the host's cores; the load average is in the header.",
        ]
    )


def main(quick: bool = False, out: Path | None = None) -> None:
    streams, output_tokens = (QUICK_STREAMS, QUICK_OUTPUT_TOKENS) if quick else (STREAMS, OUTPUT_TOKENS)
    with tempfile.TemporaryDirectory(prefix="bench-decode-pace-") as tmp:
        rows = measure(streams, output_tokens, Path(tmp))
    name = "bench_decode_pace-quick" if quick else "bench_decode_pace"
    command = "python -m bench.bench_decode_pace --quick --out DIR" if quick else None
    title = "Decode pace: client-seen TPOT vs the true step (serve-sim, SIMULATED engine)"
    write_results(name, title, rows, notes(output_tokens), command=command, out_dir=out or RESULTS_DIR)


def _cli(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_decode_pace", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 and 64 streams, 64 output tokens")
    parser.add_argument("--out", type=Path, default=None, help="directory for the results (default bench/results)")
    args = parser.parse_args(argv)
    main(quick=args.quick, out=args.out)


if __name__ == "__main__":
    _cli(sys.argv[1:])
