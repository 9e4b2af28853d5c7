"""The live progress bar of a replay (rendered by the parent process, never by a sending worker)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from harness.replay.counters import Totals


@contextlib.contextmanager
def progress_display(total: int, enabled: bool) -> Iterator[Callable[[Totals], None]]:
    """Yield an `update(totals)` function; a no-op when disabled (library use, tests)."""
    if not enabled:
        yield lambda totals: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("replay"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(
            "sent {task.fields[sent]} · in flight {task.fields[inflight]} · "
            "errors {task.fields[errors]} · lag {task.fields[lag]}"
        ),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), refresh_per_second=5) as progress:
        task = progress.add_task("replay", total=total, sent=0, inflight=0, errors=0, lag="-")

        def update(totals: Totals) -> None:
            progress.update(
                task,
                completed=totals.done,
                sent=totals.sent,
                inflight=totals.inflight,
                errors=totals.errors,
                lag=f"{totals.lag_s * 1e3:.2f} ms" if totals.sent else "-",
            )

        yield update
