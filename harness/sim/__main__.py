"""`python -m harness.sim ARGS`: the same as `replaybench serve-sim ARGS` (for launching as a subprocess)."""

from __future__ import annotations

import sys

import typer

from harness.errors import UserError
from harness.sim.commands import serve_sim


def main() -> None:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(serve_sim)
    try:
        app()
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)


if __name__ == "__main__":
    main()
