"""Decode pace as replaybench sees it: C streams that start together (prompt P tokens, exactly N output tokens,
ignore_eos, greedy), sent by `replaybench replay` from a trace whose arrivals are all t = 0, read back through
the analysis, and set beside the engine's own step.

Two client figures per case, both from the result file:
- TPOT (the analysis' per-request value, `harness.analysis.run_metrics`; mean and p50 over requests). With all
  prompts arriving at once, early requests decode beside later requests' chunked prefill, so TPOT includes
  those mixed steps: it compares with the engine's per-request TPOT, not with a pure decode step.
- window pace: in the window where every stream has its first token and none has finished (pure decode at
  batch C), window length / tokens each stream received in it. It compares with the engine-side step of
  replayssm_patch/gpu/engine_step.py ((t272 - t16) / 256 of `LLM.generate`). Tokens per chunk come from the
  result's `token_counts` column when it has one, else one per streamed chunk.

GPU host, against a vLLM server already up (tools/gpu/session.sh `pace`):

    python3 -m bench.decode_pace --url http://127.0.0.1:8000 --streams 64,256 --workers 1,4 --variant baseline \
        --mode O0 --engine-step replayssm_patch/gpu/results/engine_step-h200.json --out DIR/decode_pace.json

Rows merge into --out by (variant, mode, batch = streams, workers); each case's trace and result Parquet stay
beside it (`replaybench replay DIR/decode_pace-runs/<case>.trace.parquet --url URL --workers W` redoes one).
`bench/bench_decode_pace.py` runs the same cases against `serve-sim`, whose true step is known.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from harness.analysis.run_metrics import TimeBlocks, load_run
from harness.errors import UserError
from harness.records.decision_config import CostConfig, DecisionConfig, SloConfig
from harness.records.result_io import read_results
from harness.replay import ReplayOptions, run_replay
from harness.trace.model import Trace
from replayssm_patch.gpu.engine_step import command_line, parse_batches
from replayssm_patch.gpu.row_file import RowFileError, read_row_file, record_row
from replayssm_patch.gpu.variants import MODES, VARIANTS

PROMPT_TOKENS, OUTPUT_TOKENS = 1024, 256
ROW_KEY = ("variant", "mode", "batch", "workers")
# Every stream is sent at t = 0 by design, so the open-loop send-lag budget does not apply to a pace run; the
# receive side (client-bound) and every other fidelity check still do.
PACE_FIDELITY = DecisionConfig(lag_budget_s=math.inf)
WHAT = (
    "Client-seen decode pace through `replaybench replay` (bench/decode_pace.py): batch = streams starting "
    "together, prompt {prompt}, exactly {output} output tokens. tpot_* = the analysis' per-request TPOT; "
    "window_step_ms = pure-decode window / tokens per stream in it; engine_step_ms and engine_tpot_ms = the "
    "engine-side step and TPOT (replayssm_patch/gpu/engine_step.py) of the same variant, mode and batch "
    "(the step from the engine row's decode window where it has one, engine_step_clock = window, else from "
    "(t272 - t16) / 256; the TPOT only when measured at the same output length)."
)


def pace_trace(streams: int, prompt_tokens: int = PROMPT_TOKENS, output_tokens: int = OUTPUT_TOKENS) -> Trace:
    """`streams` completions requests arriving at t = 0 with `prompt_tokens` and `output_tokens` (forced by the
    replay), greedy. The trace holds no prompt text: the replay synthesises each request's own prompt and fits
    it to exactly `prompt_tokens` with the server's /tokenize, as for any length-only trace (recorded word
    prompts reached the H200's word-level tokenizer ~1.76x longer on 2026-12-01)."""
    return Trace.from_columns(
        {
            "request_id": [f"pace-{i}" for i in range(streams)],
            "arrival_s": [0.0] * streams,
            "api": ["completions"] * streams,
            "prompt_tokens": [prompt_tokens] * streams,
            "output_tokens": [output_tokens] * streams,
            "params": ['{"temperature": 0}'] * streams,
        },
        {"source": f"decode pace: {streams} streams at t=0, prompt {prompt_tokens}, output {output_tokens}"},
    )


@dataclass(frozen=True)
class ClientPace:
    """What the client saw in one case (milliseconds, over successful requests)."""

    requests: int
    errors: int
    exact: int  # successful requests whose server-counted output length is the one asked for
    prompt_exact: int  # successful requests whose server-counted prompt length is the trace's
    tpot_mean_ms: float | None
    tpot_p50_ms: float | None
    window_step_ms: float | None
    window_s: float | None
    window_tokens: float | None  # mean tokens per stream inside the window
    lag_p99_ms: float | None
    valid: bool
    token_counts: str  # where tokens per chunk came from


def _ms(value: float) -> float | None:
    return round(float(value) * 1e3, 3) if math.isfinite(value) else None


def decode_window(
    sent_s: list[float], token_times: list[list[float]], counts: list[list[int]] | None
) -> tuple[float | None, float | None]:
    """(seconds, mean tokens per stream inside it) of the pure-decode window: from the moment every stream has
    its first token to the first stream's last token. (None, None) when that window is empty."""
    times = [np.asarray(chunks, dtype=float) + sent for sent, chunks in zip(sent_s, token_times, strict=True)]
    if not times or not all(len(t) for t in times):
        return None, None
    start, end = float(max(t[0] for t in times)), float(min(t[-1] for t in times))
    if end <= start:
        return None, None
    weights = [np.asarray(k) for k in counts] if counts else [np.ones(len(t)) for t in times]
    inside = [float(k[(t > start) & (t <= end)].sum()) for t, k in zip(times, weights, strict=True)]
    return end - start, float(np.mean(inside))


def client_pace(result: Path) -> ClientPace:
    """Read one replay's result file through the analysis (TPOT) and its token times (window pace)."""
    run = load_run(result, TimeBlocks(0.0, 1.0, 1), SloConfig(), PACE_FIDELITY, CostConfig())
    table, _ = read_results(result)
    frame = run.requests
    ok = frame["ok"].to_numpy()
    tpot = frame["tpot_s"].to_numpy()[ok]
    good = table.filter(pa.array(ok))
    has_counts = "token_counts" in table.column_names
    usage = good.column("output_tokens_usage").to_numpy(zero_copy_only=False)
    asked = good.column("expected_output_tokens").to_numpy(zero_copy_only=False)
    server_prompt = good.column("prompt_tokens_server").to_numpy(zero_copy_only=False)
    trace_prompt = good.column("prompt_tokens").to_numpy(zero_copy_only=False)
    window, tokens = decode_window(
        good.column("sent_s").to_pylist(),
        good.column("token_times").to_pylist(),
        good.column("token_counts").to_pylist() if has_counts else None,
    )
    return ClientPace(
        requests=len(frame),
        errors=int((~ok).sum()),
        exact=int(np.sum(usage == asked)),
        prompt_exact=int(np.sum(server_prompt == trace_prompt)),
        tpot_mean_ms=_ms(float(np.mean(tpot))) if len(tpot) else None,
        tpot_p50_ms=_ms(float(np.median(tpot))) if len(tpot) else None,
        window_step_ms=_ms(window / tokens) if window and tokens else None,
        window_s=round(float(window), 3) if window else None,
        window_tokens=round(tokens, 1) if tokens else None,
        lag_p99_ms=_ms(run.fidelity.lag_p99_s) if run.fidelity.lag_p99_s is not None else None,
        valid=run.fidelity.valid,
        token_counts="token_counts column" if has_counts else "one per streamed chunk",
    )


def replay_case(url: str, trace: Trace, workers: int, runs: Path, name: str) -> Path:
    """Write the case's trace, replay it with `workers` sender processes, return the result file."""
    runs.mkdir(parents=True, exist_ok=True)
    trace_path = trace.write(runs / f"{name}.trace.parquet")
    options = ReplayOptions(workers=workers, request_timeout_s=900, read_timeout_s=300)
    outcome = run_replay(Trace.read(trace_path), url, options, runs / f"{name}.parquet", arm=name, progress=False)
    return outcome.path


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def engine_rows(path: Path | None) -> dict[tuple[str, str, int], dict[str, Any]]:
    """(variant, mode, batch) -> row of an engine_step.py results file (empty without one)."""
    if path is None:
        return {}
    if not path.exists():
        raise RowFileError(f"--engine-step {path}: no such file")
    return {(r["variant"], r["mode"], int(r["batch"])): r for r in read_row_file(path, "")["rows"]}


def case_row(variant: str, mode: str, streams: int, workers: int, pace: ClientPace, engine: dict[str, Any] | None,
             output_tokens: int) -> dict[str, Any]:  # fmt: skip
    """One case against the engine-side row of the same variant, mode and batch (None: not measured yet).
    The engine's TPOT compares only at the same output length (prefill's share of TPOT depends on it)."""
    engine = engine or {}
    clock = "window" if engine.get("window_step_ms") is not None else "t272-t16"
    step = engine.get("window_step_ms") if clock == "window" else engine.get("step_ms")
    same_length = engine.get("engine_tpot_tokens") == output_tokens
    engine_tpot = engine.get("engine_tpot_ms") if same_length else None
    return {
        "variant": variant, "mode": mode, "batch": streams, "workers": workers, "output_tokens": output_tokens,
        "engine_step_ms": step,
        "engine_step_clock": clock if step is not None else None,
        "window_vs_engine": ratio(pace.window_step_ms, step),
        "tpot_vs_engine_step": ratio(pace.tpot_mean_ms, step),
        "engine_tpot_ms": engine_tpot,
        "tpot_vs_engine_tpot": ratio(pace.tpot_mean_ms, engine_tpot),
        **asdict(pace),
    }  # fmt: skip


def case_line(row: dict[str, Any]) -> str:
    def times(value: float | None) -> str:
        return "-" if value is None else f"{value}x"

    return (
        f"{row['variant']} {row['mode']} streams {row['batch']} workers {row['workers']}: window "
        f"{row['window_step_ms']} ms vs engine step {row['engine_step_ms']} ms ({times(row['window_vs_engine'])}); "
        f"TPOT mean {row['tpot_mean_ms']} ms (p50 {row['tpot_p50_ms']}) vs engine TPOT {row['engine_tpot_ms']} ms "
        f"({times(row['tpot_vs_engine_tpot'])}); exact {row['exact']}/{row['requests']} (prompts "
        f"{row['prompt_exact']}), errors {row['errors']}, "
        f"send lag p99 {row['lag_p99_ms']} ms"
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.decode_pace", description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="base URL of the running server, e.g. http://127.0.0.1:8000")
    p.add_argument("--streams", type=parse_batches, default=(64, 256), help="comma-separated [64,256]")
    p.add_argument("--workers", type=parse_batches, default=(1, 4), help="replay sender processes [1,4]")
    p.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS)
    p.add_argument("--output-tokens", type=int, default=OUTPUT_TOKENS)
    p.add_argument("--variant", choices=list(VARIANTS), default="baseline", help="what the server runs")
    p.add_argument("--mode", choices=list(MODES), default="O0", help="the server's compile mode")
    p.add_argument("--engine-step", type=Path, help="engine_step.py results to compare with")
    p.add_argument("--out", type=Path, required=True, help="JSON file to merge the rows into")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        engine = engine_rows(args.engine_step)
        read_row_file(args.out, WHAT)
    except (RowFileError, KeyError, TypeError) as exc:
        print(f"error: {exc}; give --engine-step a file written by replayssm_patch/gpu/engine_step.py")
        return 2
    if args.output_tokens < 2 or args.prompt_tokens < 1:
        print("error: --output-tokens must be at least 2 (TPOT needs two tokens) and --prompt-tokens at least 1")
        return 2
    what = WHAT.format(prompt=args.prompt_tokens, output=args.output_tokens)
    machine = {"host": platform.node(), "cpu_cores": os.cpu_count(), "date": dt.date.today().isoformat(),
               "url": args.url}  # fmt: skip
    runs = args.out.parent / f"{args.out.stem}-runs"
    for streams in args.streams:
        trace = pace_trace(streams, args.prompt_tokens, args.output_tokens)
        for workers in args.workers:
            name = f"{args.variant}-{args.mode}-c{streams}-w{workers}"
            try:
                result = replay_case(args.url, trace, workers, runs, name)
            except UserError as exc:
                print(f"error: {exc}")
                return 2
            row = case_row(args.variant, args.mode, streams, workers, client_pace(result),
                           engine.get((args.variant, args.mode, streams)), args.output_tokens)  # fmt: skip
            record_row(args.out, row, what, command_line("bench.decode_pace", argv), machine, ROW_KEY)
            print(case_line(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
