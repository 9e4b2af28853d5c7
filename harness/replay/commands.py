"""CLI: `replaybench replay` (one arm, one run, open loop) and `replaybench replay-recover`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from harness.trace.slice_options import DurationOption, LimitOption, StartOption, slice_if_asked

if TYPE_CHECKING:
    from harness.replay.options import ReplayOutcome


def _print_summary(outcome: ReplayOutcome) -> None:
    from rich.console import Console

    from harness.records.result_io import read_results
    from harness.replay.summary import render_summary

    table, _ = read_results(outcome.path)
    Console().print(render_summary(outcome, table))


def register(app: typer.Typer) -> None:
    @app.command("replay")
    def replay(
        trace: Path = typer.Argument(..., help="Trace file (.parquet) to replay."),
        url: str = typer.Option(
            ..., "--url", help="Base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000"
        ),
        output: Path = typer.Option(..., "-o", "--output", help="Result file to write (.parquet)."),
        api: str | None = typer.Option(None, "--api", help="completions | chat for all (default: per trace row)."),
        time_scale: float = typer.Option(1.0, "--time-scale", help="Multiply arrival times (0.5 = twice the rate)."),
        workers: int = typer.Option(1, "--workers", help="Sender processes sharing one clock."),
        max_inflight: int | None = typer.Option(None, "--max-inflight", help="Cap on requests in flight."),
        seed: int = typer.Option(0, "--seed", help="Prompt synthesis seed (same seed = identical request bodies)."),
        model: str | None = typer.Option(None, "--model", help="Model name to send (default: the server's)."),
        lag_budget_ms: float = typer.Option(2.0, "--lag-budget-ms", help="p99 send lag budget of a valid run."),
        save_outputs: bool = typer.Option(False, "--save-outputs", help="Keep the generated text in the results."),
        stream: bool = typer.Option(True, "--stream/--no-stream", help="Stream responses (needed for TTFT and ITL)."),
        usage_per_chunk: bool = typer.Option(
            True,
            "--usage-per-chunk/--no-usage-per-chunk",
            help="Ask for token usage in every chunk (continuous_usage_stats); off for servers that reject it.",
        ),
        start: StartOption = 0.0,
        duration: DurationOption = None,
        limit: LimitOption = None,
        arm: str = typer.Option("replay", "--arm", help="Arm name stored in the results."),
        repeat: int = typer.Option(0, "--repeat", help="Repeat number stored in the results."),
        request_timeout: float = typer.Option(600.0, "--request-timeout", help="Seconds before a request times out."),
        read_timeout: float = typer.Option(60.0, "--read-timeout", help="Seconds of silence = timeout."),
        queue_timeout: float | None = typer.Option(
            None, "--queue-timeout", help="Longest wait for a --max-inflight slot."
        ),
        api_key: str | None = typer.Option(
            None, "--api-key", envvar="REPLAYBENCH_API_KEY", help="Bearer token for the server (never stored)."
        ),
    ) -> None:
        """Replay a trace open-loop with exact arrival timing against one server; write per-request results."""
        from harness.replay.options import ReplayOptions
        from harness.replay.runner import run_replay
        from harness.trace.model import Trace

        options = ReplayOptions(
            api=api,
            time_scale=time_scale,
            workers=workers,
            max_inflight=max_inflight,
            seed=seed,
            model=model,
            stream=stream,
            usage_per_chunk=usage_per_chunk,
            lag_budget_s=lag_budget_ms / 1e3,
            save_outputs=save_outputs,
            request_timeout_s=request_timeout,
            read_timeout_s=read_timeout,
            queue_timeout_s=queue_timeout,
            api_key=api_key,
        )
        loaded = slice_if_asked(Trace.read(trace), start, duration, limit)
        outcome = run_replay(loaded, url, options, output, arm=arm, repeat=repeat, progress=True)
        _print_summary(outcome)
        if outcome.interrupted:
            raise typer.Exit(130)

    @app.command("replay-recover")
    def replay_recover(
        output: Path = typer.Argument(..., help="The result file an interrupted replay was writing."),
    ) -> None:
        """Write the result file of a replay whose process died, from its segments (marked incomplete)."""
        from harness.replay.runner import recover_replay

        _print_summary(recover_replay(output))
