"""The `replaybench` command: a thin typer app; every command lives in its package's `commands` module."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer

from harness.errors import UserError

# Each module exposes `register(app)`; heavy imports stay inside the command functions so start-up is fast.
COMMAND_MODULES = (
    "harness.trace.commands",
    "harness.record.commands",
    "harness.replay.commands",
    "harness.sim.commands",
    "harness.experiment.commands",
    "harness.experiment.capacity_commands",
    "harness.experiment.plan_commands",
    "harness.experiment.agree_commands",
    "harness.analysis.commands",
    "harness.report.commands",
)


class _ReplaybenchApp(typer.Typer):
    """Typer app whose every user error (bad option, `UserError`) is one line on stderr and exit code 2.

    Click would print a multi-line usage box; a command's `typer.Exit(code)` keeps its code (e.g. `gate`).
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if "standalone_mode" in kwargs:
            return super().__call__(*args, **kwargs)
        try:
            outcome = super().__call__(*args, standalone_mode=False, **kwargs)
        except typer.TyperException as usage:  # typer's (vendored click) usage errors
            context = getattr(usage, "ctx", None)
            if type(usage).__name__ == "NoArgsIsHelpError" and context is not None:
                print(context.get_help())
                sys.exit(0)
            command = context.command_path if context is not None else "replaybench"
            print(f"error: {usage.format_message()} (see `{command} --help`)", file=sys.stderr)
            sys.exit(2)
        except typer.Abort:
            print("error: interrupted", file=sys.stderr)
            sys.exit(130)
        except UserError as error:
            one_line = " ".join(str(error).splitlines())  # user text inside a message must not break the line
            print(f"error: {one_line}", file=sys.stderr)
            sys.exit(error.exit_code)
        sys.exit(outcome if isinstance(outcome, int) else 0)


app = _ReplaybenchApp(
    name="replaybench",
    help="Record real LLM traffic, replay it with exact timing against paired servers, decide with statistics.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

for _module_name in COMMAND_MODULES:
    importlib.import_module(_module_name).register(app)
