"""How much load one `serve-sim` process carries before its step loop's timing error passes 1 ms.

Part 1: closed-loop streaming load from an aiohttp client in this process (C streams, prompt 64 tokens,
128 output tokens, ignore_eos) against a fresh serve-sim per level; we read the server's own step-lateness
quantiles from /metrics and count streamed tokens/s at the client.
Part 2: a time-compressed replay of the Azure conversation trace (`replaybench replay`) against serve-sim,
with the step loop's lateness over the whole replay.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.report import write_results
from harness.records.result_io import read_results
from harness.servers.ports import free_port
from harness.servers.process import ServerProcess, ServerSpec
from harness.trace.model import Trace

REPO = Path(__file__).resolve().parents[1]
LEVELS = (16, 64, 128, 256, 512)
WARMUP_S, MEASURE_S = 3.0, 8.0
PROMPT = " ".join(f"t{i}" for i in range(64))
BODY = {"model": "m", "prompt": PROMPT, "max_tokens": 128, "min_tokens": 128, "ignore_eos": True, "stream": True}
REPLAY_SLICE = {"start_s": 600.0, "duration_s": 120.0}
REPLAY_TIME_SCALES = (0.5, 0.125)
LATE_S = 1e-3
COLUMNS = (
    "part",
    "streams",
    "tokens_per_s",
    "steps",
    "lateness_p50_ms",
    "lateness_p99_ms",
    "lateness_max_ms",
    "steps_late_over_1ms_pct",
    "delivery_lag_p50_ms",
    "delivery_lag_p99_ms",
    "sustained",
    "errors",
    "client_lag_p99_ms",
)


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            values[key] = float(value)
    return values


def lateness(metrics: dict[str, float]) -> dict[str, object]:
    """Step-loop wake-up lateness and token delivery lag, as the server reports them."""
    steps = metrics["replaybench_sim_step_lateness_seconds_count"]
    step_q = 'replaybench_sim_step_lateness_quantile_seconds{quantile="%s"}'
    delivery_q = 'replaybench_sim_token_delivery_lag_quantile_seconds{quantile="%s"}'
    return {
        "steps": int(steps),
        "lateness_p50_ms": round(metrics[step_q % "0.5"] * 1e3, 3),
        "lateness_p99_ms": round(metrics[step_q % "0.99"] * 1e3, 3),
        "lateness_max_ms": round(metrics["replaybench_sim_step_lateness_max_seconds"] * 1e3, 3),
        "steps_late_over_1ms_pct": round(100 * metrics["replaybench_sim_step_lateness_over_1ms_total"] / steps, 2)
        if steps
        else 0.0,
        "delivery_lag_p50_ms": round(metrics[delivery_q % "0.5"] * 1e3, 3),
        "delivery_lag_p99_ms": round(metrics[delivery_q % "0.99"] * 1e3, 3),
    }


def sim_server(log_dir: Path, *extra: str) -> ServerProcess:
    port = free_port()
    argv = (sys.executable, "-m", "harness.sim", "--port", str(port), "--served-model-name", "m", *extra)
    spec = ServerSpec(label="sim", argv=argv, port=port, ready_url=f"http://127.0.0.1:{port}/health", cwd=REPO)
    return ServerProcess(spec, log_dir / f"sim-{port}.log")


async def closed_loop(url: str, streams: int) -> int:
    """C streams back to back for WARMUP_S + MEASURE_S; returns tokens received inside the measured window."""
    import aiohttp

    started = time.monotonic()
    window = (started + WARMUP_S, started + WARMUP_S + MEASURE_S)
    counted = 0

    async def one_stream(session: aiohttp.ClientSession) -> None:
        nonlocal counted
        while time.monotonic() < window[1]:
            async with session.post(url + "/v1/completions", json=BODY) as response:
                async for line in response.content:
                    now = time.monotonic()
                    if line.startswith(b"data: {") and window[0] <= now < window[1]:
                        counted += 1

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        await asyncio.gather(*(one_stream(session) for _ in range(streams)))
    return counted


def idle_timer_row(period_s: float = 0.005, ticks: int = 1000) -> dict[str, object]:
    """Control: the same sleep-then-spin wake-up with no server and no load: the host's own timer floor."""
    import numpy as np

    from harness.sim.realtime import sleep_until

    async def ticker() -> list[float]:
        late, deadline = [], time.monotonic()
        for _ in range(ticks):
            deadline += period_s
            await sleep_until(deadline)
            late.append(time.monotonic() - deadline)
        return late

    ms = np.array(asyncio.run(ticker())) * 1e3
    p99 = float(np.percentile(ms, 99))
    return {
        "part": "control: idle 5 ms timer, no server",
        "streams": 0,
        "tokens_per_s": 0.0,
        "steps": ticks,
        "lateness_p50_ms": round(float(np.median(ms)), 3),
        "lateness_p99_ms": round(p99, 3),
        "lateness_max_ms": round(float(ms.max()), 3),
        "steps_late_over_1ms_pct": round(100 * float((ms > 1).mean()), 2),
        "sustained": p99 <= LATE_S * 1e3,
    }


def capacity_rows(log_dir: Path) -> list[dict[str, object]]:
    rows = []
    for streams in LEVELS:
        with sim_server(log_dir, "--max-num-seqs", str(max(LEVELS))) as server:
            server.wait_ready()
            tokens = asyncio.run(closed_loop(server.base_url, streams))
            late = lateness(scrape(server.base_url))
        rows.append(
            {
                "part": "closed loop",
                "streams": streams,
                "tokens_per_s": round(tokens / MEASURE_S, 1),
                **late,
                "sustained": late["lateness_p99_ms"] <= LATE_S * 1e3,
            }
        )
        print(rows[-1], flush=True)
    return rows


def replay_row(log_dir: Path, time_scale: float) -> dict[str, object]:
    import subprocess

    trace_path, out = log_dir / "azure-conv-slice.parquet", log_dir / f"replay-{time_scale}.parquet"
    Trace.read(REPO / "traces/azure-conv-2023.parquet").slice(**REPLAY_SLICE).write(trace_path)
    with sim_server(log_dir) as server:
        server.wait_ready()
        code = "import sys; from harness.cli import app; sys.argv[0] = 'replaybench'; app()"
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                code,
                "replay",
                str(trace_path),
                "--url",
                server.base_url,
                "-o",
                str(out),
                "--time-scale",
                str(time_scale),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        late = lateness(scrape(server.base_url))
    if done.returncode not in (0, 1) or not out.exists():
        return {"part": "azure conv replay", "error": done.stderr.strip()[-300:]}
    table, _ = read_results(out)
    rows = table.to_pylist()
    errors = sum(r["error"] is not None for r in rows)
    lags = sorted(r["lag_s"] for r in rows if r["lag_s"] is not None)
    tokens = sum(r["output_tokens"] or 0 for r in rows)
    span = REPLAY_SLICE["duration_s"] * time_scale
    return {
        "part": f"azure conv replay ({len(rows)} req, x{1 / time_scale:g} rate)",
        "streams": max(1, len(rows)),
        "tokens_per_s": round(tokens / span, 1),
        **late,
        "sustained": late["lateness_p99_ms"] <= LATE_S * 1e3,
        "errors": errors,
        "client_lag_p99_ms": round(1e3 * lags[int(0.99 * (len(lags) - 1))], 2) if lags else None,
    }


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-sim-") as tmp:
        log_dir = Path(tmp)
        rows = [idle_timer_row(), *capacity_rows(log_dir), *(replay_row(log_dir, s) for s in REPLAY_TIME_SCALES)]
    sustained = [r for r in rows if r["part"] == "closed loop" and r["sustained"]]
    best = max(sustained, key=lambda r: r["streams"]) if sustained else None
    headline = (
        f"Largest closed-loop level with step-lateness p99 <= 1 ms: {best['streams']} streams, "
        f"{best['tokens_per_s']} streamed tokens/s."
        if best
        else "No level kept step-lateness p99 <= 1 ms."
    )
    notes = " ".join(
        [
            headline,
            f"Host: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end.",
            f"Engine: nemotron-h-8b on a simulated H200, baseline fp32 state, --max-num-seqs {max(LEVELS)}.",
            "Step lateness = how late the engine loop woke after each step's absolute deadline (server-side, from",
            "/metrics, quantiles over the run); delivery lag = deadline to the token chunk's socket write.",
            "The client runs in the benchmark process on the same host.",
            "The control row times the same sleep-then-spin wake-up with nothing else running: when it is already",
            "above 1 ms the host, not the engine, sets the floor (compare the load average in the header).",
            "The Azure rows replay a 120 s slice (start 600 s) of traces/azure-conv-2023.parquet at 2x and 8x its",
            "rate with `replaybench replay`; 'streams' there is the request count, client lag the replay's send lag.",
            "Everything measured here is the SIMULATED engine.",
        ]
    )
    table = [{column: row.get(column, "") for column in COLUMNS} for row in rows]
    write_results("bench_sim", "serve-sim (SIMULATED engine): load one process sustains", table, notes)


if __name__ == "__main__":
    main()
