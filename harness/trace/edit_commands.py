"""`replaybench merge` and `slice`: turn existing trace files into the one trace a run needs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from harness.errors import UserError
from harness.trace.slice_options import DurationOption, LimitOption, StartOption, TimeScaleOption, slice_if_asked

if TYPE_CHECKING:
    from harness.trace.model import Trace

Output = Annotated[Path, typer.Option("-o", "--output", help="trace to write (.parquet)")]


def _print_written(verb: str, trace: Trace, out: Path, notes: list[str]) -> None:
    from rich.console import Console

    from harness.trace.stats import compute_stats, format_rate

    stats = compute_stats(trace)
    console = Console(soft_wrap=True)
    console.print(f"[bold]{verb}[/] {len(trace):,} requests -> {out}")
    for note in notes:
        console.print(f"  · {note}")
    console.print(
        f"  span {stats.span_s:,.1f} s · mean {format_rate(stats.mean_rate)} · "
        f"peak minute {format_rate(stats.peak_rate)} · failed {stats.failed:,}"
    )
    console.print(f"  next: replaybench inspect {out}")


def merge_command(
    parts: Annotated[list[str], typer.Argument(metavar="PART...", help="trace parts, a directory or a glob")],
    out: Output,
    concat: Annotated[
        bool,
        typer.Option(
            "--concat",
            help="append parts back to back in the given order instead of placing them by their absolute clock",
        ),
    ] = False,
    prefix_ids: Annotated[
        bool,
        typer.Option(
            "--prefix-ids", help="prefix every request id with its part's file name (needed when parts share ids)"
        ),
    ] = False,
) -> None:
    """Merge trace parts (e.g. a recorder's rotated or per-worker files) into one trace, ordered by arrival."""
    from rich.console import Console

    from harness.trace.merge import Part, expand_part_paths, merge_parts
    from harness.trace.model import Trace

    paths = expand_part_paths(parts, out)
    with Console().status(f"merging {len(paths)} part(s)"):
        merged = merge_parts([Part(path, Trace.read(path)) for path in paths], concat=concat, prefix_ids=prefix_ids)
        merged.write(out)
    how = "back to back, in the given order" if concat else "by absolute arrival time"
    notes = [f"{len(paths)} part(s) placed {how}: {paths[0].name} ... {paths[-1].name}"]
    if prefix_ids:
        notes.append("request ids prefixed with their part's file name")
    _print_written("merged", merged, out, notes)


def slice_command(
    trace_path: Annotated[Path, typer.Argument(metavar="TRACE", help="a replaybench trace (.parquet)")],
    out: Output,
    start: StartOption = 0.0,
    duration: DurationOption = None,
    limit: LimitOption = None,
    time_scale: TimeScaleOption = 1.0,
) -> None:
    """Cut a window out of a trace and/or compress its time; arrivals are re-based to start at 0."""
    from harness.trace.model import Trace

    if out.resolve() == trace_path.resolve():
        raise UserError(f"{out}: the output would overwrite the trace; choose another -o path")
    trace = Trace.read(trace_path)
    sliced = slice_if_asked(trace, start, duration, limit, time_scale)
    sliced.write(out)
    _print_written(
        "sliced",
        sliced,
        out,
        [
            f"kept {len(sliced):,} of {len(trace):,} requests from {trace_path}"
            f" ({sliced.metadata.get('slice', 'no slice options given')})"
        ],
    )


def register(app: typer.Typer) -> None:
    app.command("merge")(merge_command)
    app.command("slice")(slice_command)
