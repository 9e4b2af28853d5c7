"""`--start/--duration/--limit/--time-scale`: one definition for every command that cuts a trace before use,
so `import`, `slice`, `replay` and `simulate` accept and check them the same way."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from harness.errors import UserError

if TYPE_CHECKING:
    from harness.trace.model import Trace

StartOption = Annotated[float, typer.Option("--start", help="keep requests from this trace second on")]
DurationOption = Annotated[float | None, typer.Option("--duration", help="keep this many seconds from --start")]
LimitOption = Annotated[int | None, typer.Option("--limit", help="keep at most this many requests")]
TimeScaleOption = Annotated[float, typer.Option("--time-scale", help="multiply arrival times (0.5 = twice the rate)")]


def slice_if_asked(
    trace: Trace, start: float = 0.0, duration: float | None = None, limit: int | None = None, time_scale: float = 1.0
) -> Trace:
    """`trace.slice(...)` after checking the options; the trace itself when none was given."""
    if start < 0 or (duration is not None and duration <= 0):
        raise UserError(f"--start must be >= 0 and --duration > 0 seconds (got {start}, {duration})")
    if not start and duration is None and limit is None and time_scale == 1.0:
        return trace  # the whole trace at its own pace: no `slice` note in its metadata
    return trace.slice(start, duration, limit, time_scale)
