"""`replaybench run` and `replaybench check`: paired experiments from a config file.

This is the CLI layer: it may call the report builder at the end of a run (the experiment library itself
never imports analysis or report). Heavy imports stay inside the functions so `replaybench --help` is fast.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from harness.errors import UserError

if TYPE_CHECKING:
    from rich.console import Console

    from harness.experiment.check import Finding
    from harness.experiment.config import ExperimentConfig
    from harness.records.run_dir import RunDir

_LEVEL_STYLE = {"ok": "[green]ok  [/]", "warn": "[yellow]WARN[/]", "fail": "[red]FAIL[/]"}
_OUTCOME_STYLE = {"KEEP": "green", "REJECT": "red", "INCONCLUSIVE": "yellow", "INVALID": "magenta"}


def _print_findings(console: Console, config: ExperimentConfig, findings: list[Finding]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from harness.experiment.settings_diff import arm_differences

    console.print(f"[bold]{config.name}[/]: {config.mode} experiment, {config.repeats} repeat(s), order {config.order}")
    for finding in findings:
        console.print(f"  {_LEVEL_STYLE[finding.level]} {finding.topic:<9} {escape(finding.message)}", soft_wrap=True)
    diffs = arm_differences(config)
    if diffs:
        table = Table(title="baseline vs candidate: effective settings that differ", title_justify="left")
        for column in ("kind", "setting", "baseline", "candidate", "declared"):
            table.add_column(column, overflow="fold")
        for d in diffs:
            table.add_row(
                d.kind,
                escape(d.key),
                escape(d.baseline or "-"),
                escape(d.candidate or "-"),
                "[green]policy change[/]" if d.declared else "[yellow]NOT declared[/]",
            )
        console.print(table)


def _preflight(console: Console, config: ExperimentConfig) -> None:
    """Print every finding; refuse to go on when one failed."""
    from harness.experiment.check import run_checks

    findings = run_checks(config)
    _print_findings(console, config, findings)
    failed = [f for f in findings if f.level == "fail"]
    if failed:
        raise UserError(f"preflight check failed ({len(failed)} problem(s)), first: {failed[0].message}")


def check(config: Annotated[Path, typer.Argument(help="experiment .toml")]) -> None:
    """Preflight an experiment: trace, commands, ports, GPUs, versions, model, declarations, and a diff of the
    two arms' effective settings (warns when more than the declared policy change differs)."""
    from rich.console import Console

    from harness.experiment.config import load_config

    _preflight(Console(), load_config(config))


def print_summary(console: Console, root: Path) -> None:
    """The one-screen ending: the decision, the decision metrics, and where the report is."""
    import json

    from rich.markup import escape
    from rich.table import Table

    from harness.analysis.decision import confidence_level
    from harness.analysis.model import Stability
    from harness.records.run_dir import RunDir
    from harness.report.text_outputs import load_text

    run = RunDir(root)
    summary = json.loads(run.summary_json.read_text())
    decision = summary["decision"]
    level = f"{confidence_level(summary['alpha'])} CI"  # the level tested: not 95 % at another alpha or a look's
    table = Table(title=f"decision metrics (candidate / baseline, {level} over repeats)", title_justify="left")
    for column in ("metric", "role", "ratio", level, "margin", "verdict"):
        table.add_column(column)
    for c in summary["comparisons"]:
        if c["role"] == "exploratory":
            continue
        ci = f"{c['ci_low']:.3f} - {c['ci_high']:.3f}" if c["ci_low"] is not None else "-"
        table.add_row(
            c["metric"],
            c["role"],
            f"{c['ratio']:.3f}" if c["ratio"] is not None else "-",
            ci,
            f"±{c['margin']:.0%}" if c["margin"] is not None else "-",
            c["verdict"] or "-",
        )
    console.print(table)
    console.print(f"load: {escape(load_text(Stability.model_validate(summary['stability'])))}")
    colour = _OUTCOME_STYLE.get(decision["outcome"], "white")
    console.print(f"[bold {colour}]{decision['outcome']}[/]: {escape(decision['reason'])}")
    console.print(f"run directory: {root}\nreport: {run.index_html}")


def run(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="experiment .toml")] = None,
    # accepted so the documented `replaybench run --paired` works; every run is paired (A/B or A/A)
    paired: Annotated[bool, typer.Option("--paired", help="run baseline and candidate (always on; explicit)")] = True,
    repeats: Annotated[int | None, typer.Option("--repeats", min=1, help="override the config's repeats")] = None,
    resume: Annotated[Path | None, typer.Option("--resume", help="continue an interrupted run directory")] = None,
    save_outputs: Annotated[bool, typer.Option("--save-outputs", help="keep every generated text")] = False,
    output_dir: Annotated[Path, typer.Option("--output-dir", help="where run directories go")] = Path("reports"),
) -> None:
    """Run a paired experiment: replay the trace against both arms, repeatedly, then analyse and report."""
    from rich.console import Console

    console = Console()
    root = execute_run(console, config, repeats, resume, save_outputs, output_dir)
    print_summary(console, root)


def _open_run(
    console: Console,
    config_path: Path | None,
    repeats: int | None,
    resume: Path | None,
    save_outputs: bool,
    output_dir: Path,
) -> tuple[ExperimentConfig, RunDir]:
    """A resumed run directory, or a new one with the checked config frozen and env.json written."""
    from harness.experiment.config import load_config, with_ports
    from harness.experiment.environment import collect_environment, write_environment
    from harness.experiment.rundir import freeze_config, load_frozen, new_run_dir

    if resume is not None:
        config, run_dir = load_frozen(resume)
        if repeats is not None and repeats != config.repeats:
            raise UserError(
                f"--repeats {repeats} differs from the frozen run ({config.repeats}); "
                "a resumed run keeps its declared settings: drop --repeats"
            )
        _preflight(console, config)
        return config, run_dir
    if config_path is None:
        raise UserError("give --config EXPERIMENT.toml (or --resume RUN_DIR); see configs/demo.toml")
    config = load_config(config_path)
    updates: dict[str, object] = {}
    if repeats is not None:
        updates["repeats"] = repeats
    if save_outputs:
        updates["replay"] = config.replay.model_copy(update={"save_outputs": True})
    config = config.model_copy(update=updates)
    _preflight(console, config)
    config = with_ports(config)
    run_dir = new_run_dir(output_dir, config.name)
    if not config.trace.load_resolved:
        config = _settle_load(console, config, run_dir)
    freeze_config(config, run_dir)
    write_environment(run_dir.env_json, collect_environment(config, sys.argv))
    return config, run_dir


def _settle_load(console: Console, config: ExperimentConfig, run_dir: RunDir) -> ExperimentConfig:
    """`[trace] load` -> a time scale, from the given capacity.json (copied into the run directory, where the
    report shows it) or from a quick capacity probe of the baseline written there."""
    import shutil

    from harness.atomic import atomic_path
    from harness.experiment.capacity_commands import VIRTUAL_PROBE, search_capacity, virtual_capacity
    from harness.experiment.capacity_probe import CapacityFiles
    from harness.experiment.load import (
        BASELINE,
        PROBE_BOUNDS,
        PROBE_REPEATS,
        baseline_time_scale,
        capacity_file,
        describe_load,
        read_capacity,
        with_load,
    )

    written = CapacityFiles(run_dir.root).capacity_json
    if config.trace.capacity is not None:
        scale = read_capacity(config.trace.capacity, config)
        source = str(capacity_file(config.trace.capacity))
        with atomic_path(written) as tmp:
            shutil.copyfile(source, tmp)
    elif config.trace.capacity_probe == "virtual":
        console.print(
            "no \\[trace] capacity given: simulating the baseline's capacity in virtual time", highlight=False
        )
        scale, source = virtual_capacity(config), VIRTUAL_PROBE
    else:
        console.print(
            "no \\[trace] capacity given: probing the baseline's capacity first (one replay per probe)", highlight=False
        )
        found = search_capacity(console, config, run_dir.root, (BASELINE,), PROBE_REPEATS, PROBE_BOUNDS)
        scale = baseline_time_scale({BASELINE: found[BASELINE].to_json(config.slo.attainment_target)}, str(written))
        source = "probe"
    settled = with_load(config, scale, source)
    console.print(describe_load(settled))
    return settled


def execute_run(
    console: Console,
    config_path: Path | None,
    repeats: int | None,
    resume: Path | None,
    save_outputs: bool,
    output_dir: Path,
) -> Path:
    """Check, freeze, run every repeat, build the report; returns the run directory. Used by the demo too."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from harness.experiment.runner import ExperimentRunner
    from harness.report.build import build_report
    from harness.servers.cleanup import Terminated

    config, run_dir = _open_run(console, config_path, repeats, resume, save_outputs, output_dir)
    console.print(f"run directory: {run_dir.root}")
    steps = 2 * config.repeats + (1 if config.quality_tasks else 0)
    columns = (TextColumn("{task.description:<32}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task("starting", total=steps)
            ExperimentRunner(
                config, run_dir, lambda what, done: progress.update(task, description=what, advance=done)
            ).execute()
    except (KeyboardInterrupt, Terminated) as stop:
        console.print(
            f"[yellow]interrupted[/]; every finished attempt is kept. Continue with:\n"
            f"  replaybench run --resume {run_dir.root}"
        )
        raise SystemExit(128 + getattr(stop, "signum", signal.SIGINT)) from None
    with console.status("analysing and writing the report ..."):
        build_report(run_dir.root)
    return run_dir.root


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("check")(check)
