"""`replaybench gate RUN_DIR`: re-analyse a run directory and turn its decision into an exit status for CI."""

from __future__ import annotations

from pathlib import Path

import typer

GATE_HELP = (
    "Decide KEEP / REJECT / INCONCLUSIVE / INVALID for a run directory and exit with it.\n\n"
    "Exit status: 0 KEEP, 1 REJECT, 2 INCONCLUSIVE, 3 INVALID (also for a missing or unusable run directory).\n\n"
    "Note: the CLI also exits 2 on a usage error such as a misspelt option; those print `Usage:` or `error:` "
    "on stderr, while the gate always prints its one-line verdict on stdout.\n\n"
    "Never needs the servers: it re-reads the result files."
)


def gate(run_dir: Path = typer.Argument(..., help="Run directory written by `replaybench run`.")) -> None:
    from harness.analysis.analyse import analyse_run_dir
    from harness.analysis.inputs import UnusableRunDir
    from harness.analysis.model import Outcome

    try:
        decision = analyse_run_dir(run_dir).summary.decision
    except UnusableRunDir as error:
        typer.echo(f"INVALID: {error}")
        raise typer.Exit(Outcome.INVALID.exit_code) from None
    typer.echo(f"{decision.outcome.value}: {decision.reason}")
    raise typer.Exit(decision.exit_code)


def register(app: typer.Typer) -> None:
    app.command("gate", help=GATE_HELP)(gate)
