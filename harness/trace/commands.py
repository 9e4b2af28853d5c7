"""`replaybench import`, `export` and `inspect`: get traces in and out, and see what load they describe."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.errors import UserError
from harness.trace import edit_commands
from harness.trace.exporters import EXPORT_FORMATS
from harness.trace.importers import IMPORTERS
from harness.trace.slice_options import DurationOption, LimitOption, StartOption, TimeScaleOption, slice_if_asked

IMPORT_FORMATS = tuple(IMPORTERS)


def _choice(value: str, choices: tuple[str, ...], what: str) -> str:
    if value not in choices:
        raise UserError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")
    return value


def _require_output(out: Path | None, example: str) -> Path:
    if out is None:
        raise UserError(f"no output file given; add -o {example}")
    return out


def import_command(
    fmt: Annotated[str, typer.Argument(metavar="FORMAT", help=f"source format: {', '.join(IMPORT_FORMATS)}")],
    src: Annotated[Path, typer.Argument(help="the source file (CSV or JSONL)")],
    out: Annotated[Path | None, typer.Option("-o", "--output", help="trace to write (.parquet); required")] = None,
    start: StartOption = 0.0,
    duration: DurationOption = None,
    limit: LimitOption = None,
    time_scale: TimeScaleOption = 1.0,
    block_size: Annotated[
        int | None, typer.Option(help="tokens per prefix block (mooncake: 512, vllm-timed: 16 by default)")
    ] = None,
    id_prefix: Annotated[str | None, typer.Option(help="request id prefix (default: format + file name)")] = None,
) -> None:
    """Import a public or logged trace into the replaybench trace format (Parquet)."""
    from rich.console import Console

    from harness.trace.importers import import_trace
    from harness.trace.importers.common import ImportOptions
    from harness.trace.stats import compute_stats, format_rate

    _choice(fmt, IMPORT_FORMATS, "import format")
    out = _require_output(out, "trace.parquet")
    if out.resolve() == src.resolve():
        raise UserError(f"{out}: the output would overwrite the source; choose another -o path")
    console = Console(soft_wrap=True)
    with console.status(f"importing {src} ({fmt})"):
        result = import_trace(fmt, src, ImportOptions(id_prefix=id_prefix, block_size=block_size))
        trace = slice_if_asked(result.trace, start, duration, limit, time_scale)
        trace.write(out)
    stats = compute_stats(trace)
    console.print(f"[bold]imported[/] {len(trace):,} requests from {src} -> {out}")
    for note in result.notes:
        console.print(f"  · {note}")
    if len(trace) != len(result.trace):
        console.print(f"  · kept {len(trace):,} of {len(result.trace):,} requests ({trace.metadata['slice']})")
    console.print(
        f"  span {stats.span_s:,.1f} s · mean {format_rate(stats.mean_rate)} · "
        f"peak minute {format_rate(stats.peak_rate)} · failed {stats.failed:,}"
    )
    console.print(f"  next: replaybench inspect {out}")


def export_command(
    trace_path: Annotated[Path, typer.Argument(metavar="TRACE", help="a replaybench trace (.parquet)")],
    fmt: Annotated[str | None, typer.Option("--format", help=f"one of {', '.join(EXPORT_FORMATS)}; required")] = None,
    out: Annotated[Path | None, typer.Option("-o", "--output", help="file to write (.jsonl); required")] = None,
) -> None:
    """Export a trace to another tool's format (Mooncake JSONL, vLLM timed_trace JSONL) to cross-check there."""
    from rich.console import Console

    from harness.trace.exporters import export_trace
    from harness.trace.model import Trace

    if fmt is None:
        raise UserError(f"no export format given; add --format with one of {', '.join(EXPORT_FORMATS)}")
    _choice(fmt, EXPORT_FORMATS, "export format")
    out = _require_output(out, "trace.jsonl")
    result = export_trace(Trace.read(trace_path), out, fmt)
    console = Console(soft_wrap=True)
    console.print(f"[bold]exported[/] {result.rows:,} requests from {trace_path} -> {result.path} ({fmt})")
    for note in result.notes:
        console.print(f"  · {note}", soft_wrap=True)


def inspect_command(
    trace_path: Annotated[Path, typer.Argument(metavar="TRACE", help="a replaybench trace (.parquet)")],
    html: Annotated[Path | None, typer.Option("--html", help="also write a self-contained HTML page here")] = None,
) -> None:
    """Show a trace's load: rate, burstiness, peak minute, length percentiles, sessions, failures, prefix reuse."""
    from rich.console import Console
    from rich.table import Table

    from harness.trace.model import Trace
    from harness.trace.stats import compute_stats, summary_rows

    trace = Trace.read(trace_path)
    stats = compute_stats(trace)
    table = Table(title=f"trace {trace_path}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for label, value in summary_rows(stats):
        table.add_row(label, value)
    console = Console(soft_wrap=True)
    console.print(table)
    if html is not None:
        from harness.trace.inspect_html import write_inspect_html

        written = write_inspect_html(trace, stats, html, title=str(trace_path))
        console.print(f"wrote {written}")


def register(app: typer.Typer) -> None:
    app.command("import")(import_command)
    app.command("export")(export_command)
    app.command("inspect")(inspect_command)
    edit_commands.register(app)  # merge, slice
