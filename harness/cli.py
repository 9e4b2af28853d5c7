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
    "harness.analysis.commands",
    "harness.report.commands",
)


class _ReplaybenchApp(typer.Typer):
    """Typer app that turns a `UserError` into one clear line on stderr and exit code 2, never a traceback."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(error.exit_code)


app = _ReplaybenchApp(
    name="replaybench",
    help="Record real LLM traffic, replay it with exact timing against paired servers, decide with statistics.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

for _module_name in COMMAND_MODULES:
    try:
        _module = importlib.import_module(_module_name)
    except ModuleNotFoundError as missing:
        if missing.name != _module_name:
            raise
        continue
    _module.register(app)
