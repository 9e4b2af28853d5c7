"""`replaybench record`: the recording proxy (and `--recover` for segments left by a killed recorder)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from harness.errors import UserError
from harness.record.options import DEFAULT_BLOCK_SIZE, DEFAULT_SESSION_HEADER, DEFAULT_TENANT_HEADER

if TYPE_CHECKING:
    from harness.record.options import RecordOptions

NON_TTY_STATUS_EVERY_S = 60.0


def record(
    upstream: str = typer.Option(None, "--upstream", help="Base URL of the OpenAI-compatible server to proxy."),
    listen: str = typer.Option("127.0.0.1:8080", "--listen", help="HOST:PORT to listen on (port 0: any free)."),
    output: Path = typer.Option(
        None, "-o", "--output", help="Trace path: prod.parquet -> prod-0001.parquet, prod-0002.parquet, ..."
    ),
    redact: str = typer.Option(
        "none", "--redact", help="none: keep text; hash: token-block hashes, no text; drop: counts only."
    ),
    rotate: str = typer.Option("15m", "--rotate", help="Start a new Parquet part this often (0: never)."),
    max_body: str = typer.Option("4MiB", "--max-body", help="Larger request bodies are forwarded, not recorded."),
    session_header: str = typer.Option(
        DEFAULT_SESSION_HEADER, "--session-header", help="Request header holding the session id."
    ),
    tenant_header: str = typer.Option(
        DEFAULT_TENANT_HEADER, "--tenant-header", help="Request header holding the tenant."
    ),
    block_size: int = typer.Option(DEFAULT_BLOCK_SIZE, "--block-size", help="Tokens per prefix block (hash mode)."),
    drain: str = typer.Option("10s", "--drain", help="On shutdown, wait this long for requests in flight."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow listening on a non-loopback address."),
    workers: str = typer.Option(
        "auto",
        "--workers",
        metavar="N|auto",
        help="Proxy processes sharing the port (SO_REUSEPORT): a number, or auto = one per 4 cores, at most 4 "
        "(1 below 8 cores). With more than one, each writes its own parts, OUT-w1-0001.parquet, ...",
    ),
    recover: Path = typer.Option(
        None, "--recover", help="Turn segments left in DIR by a killed recorder into Parquet parts, then exit."
    ),
) -> None:
    """Record production traffic: a reverse proxy that forwards everything and writes a trace."""
    if recover is not None:
        _recover(recover)
        return
    options = _options(
        upstream,
        listen,
        output,
        redact,
        rotate,
        max_body,
        session_header,
        tenant_header,
        block_size,
        drain,
        allow_remote,
        workers,
    )
    _run(options)


def _options(
    upstream: str | None,
    listen: str,
    output: Path | None,
    redact: str,
    rotate: str,
    max_body: str,
    session_header: str,
    tenant_header: str,
    block_size: int,
    drain: str,
    allow_remote: bool,
    workers: str,
) -> RecordOptions:
    from harness.record.options import (
        RecordOptions,
        check_header_name,
        check_redaction,
        parse_duration,
        parse_listen,
        parse_size,
        parse_upstream,
        parse_workers,
        usable_cores,
    )

    if upstream is None or output is None:
        raise UserError(
            "record needs --upstream URL and -o OUT (or --recover DIR); e.g. "
            "replaybench record --upstream http://127.0.0.1:8000 -o traces/prod.parquet"
        )
    if block_size < 1:
        raise UserError(f"--block-size must be at least 1 (got {block_size}); 16 matches vLLM's KV block")
    host, port = parse_listen(listen, allow_remote)
    return RecordOptions(
        upstream=parse_upstream(upstream),
        host=host,
        port=port,
        output=output,
        redact=check_redaction(redact),
        rotate_s=parse_duration(rotate),
        max_body=parse_size(max_body),
        session_header=check_header_name(session_header, "--session-header"),
        tenant_header=check_header_name(tenant_header, "--tenant-header"),
        block_size=block_size,
        drain_s=parse_duration(drain, "--drain"),
        workers=parse_workers(workers, usable_cores()),
    )


def _run(options: RecordOptions) -> None:
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    from harness.record.service import run_recorder
    from harness.record.workers import run_workers

    err = Console(stderr=True, highlight=False)
    live = Live(Text(""), console=err, transient=True, auto_refresh=False) if err.is_terminal else None
    last_plain = [0.0]

    def announce(line: str) -> None:
        print(line, flush=True)

    def report(line: str) -> None:
        err.print(line, markup=False, soft_wrap=True)

    def show_status(line: str) -> None:
        if live is not None:
            live.update(Text(line), refresh=True)
        elif time.monotonic() - last_plain[0] >= NON_TTY_STATUS_EVERY_S:
            last_plain[0] = time.monotonic()
            print(line, file=sys.stderr, flush=True)

    if options.workers > 1:  # no live status line: each worker's counters reach the parent when it finishes
        stats = run_workers(options, announce, report)
    else:
        if live is not None:
            live.start()
        try:
            stats = run_recorder(options, announce, report, show_status)
        finally:
            if live is not None:
                live.stop()
    for line in stats.summary_lines():
        print(line, flush=True)
    if stats.rows_lost or stats.segments_kept or stats.worker_deaths:
        raise typer.Exit(1)  # data was lost or still needs `--recover`: let scripts notice


def _recover(directory: Path) -> None:
    from harness.record.recover import recover

    result = recover(directory)
    for written in result.written:
        target = written.part or "no part (no complete rows)"
        print(f"{written.segment.name} -> {target}: {written.rows} rows, {written.bad_lines} torn line(s) skipped")
    for segment in result.in_use:
        print(f"{segment.name}: left alone, a running recorder holds it")
    for line in result.failed:
        print(f"error: {line}", file=sys.stderr)
    if not (result.written or result.in_use or result.failed):
        print(f"no segments to recover in {directory}")
    if result.failed:
        raise UserError(
            f"{len(result.failed)} segment(s) could not be recovered (see above); fix the cause "
            "(e.g. free disk space) and run --recover again"
        )


def register(app: typer.Typer) -> None:
    app.command("record")(record)
