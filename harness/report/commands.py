"""`replaybench report RUN_DIR`: re-analyse a run directory and rewrite its HTML, JSON, Markdown and JUnit files."""

from __future__ import annotations

from pathlib import Path

import typer


def report(run_dir: Path = typer.Argument(..., help="Run directory written by `replaybench run`.")) -> None:
    """Re-analyse RUN_DIR from its result files (never needs the servers) and rewrite index.html, summary.json,
    decision.json, summary.md and junit.xml."""
    from rich.console import Console

    from harness.report.build import build_report

    console = Console(stderr=True)
    with console.status(f"analysing {run_dir} ..."):
        decision = build_report(run_dir)
    colour = {"KEEP": "green", "REJECT": "red", "INCONCLUSIVE": "yellow", "INVALID": "magenta"}[decision.outcome]
    console.print(f"[bold {colour}]{decision.outcome.value}[/]: {decision.reason}")
    console.print(
        f"repeats used: {', '.join(map(str, decision.repeats_used)) or 'none'}"
        + "".join(f"\nexcluded repeat {e.repeat}: {'; '.join(e.reasons)}" for e in decision.excluded)
    )
    console.print(f"report: {Path(run_dir) / 'index.html'}  (also summary.json, decision.json, summary.md, junit.xml)")


def register(app: typer.Typer) -> None:
    app.command("report")(report)
