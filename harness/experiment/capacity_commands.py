"""`replaybench capacity`: per arm, the largest trace time compression held within the SLO, and its cost.

This is the CLI layer: like `run`, it may use analysis (to score each probe's result file exactly as the report
scores a repeat); the search (`capacity.py`) and the probes (`capacity_probe.py`) never import it.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from harness.errors import UserError

if TYPE_CHECKING:
    from rich.console import Console

    from harness.experiment.capacity import Capacity, SearchBounds
    from harness.experiment.capacity_probe import Score
    from harness.experiment.config import ExperimentConfig
    from harness.records.run_dir import RunDir


def score_result(config: ExperimentConfig) -> Score:
    """SLO attainment and cost per successful request of one result file, as `replaybench report` computes them."""
    from harness.analysis.run_metrics import TimeBlocks, load_run

    def score(path: Path) -> tuple[float, float]:
        metrics = load_run(path, TimeBlocks(0.0, 1.0, 1), config.slo, config.decision, config.cost).metrics
        return metrics["slo_attainment"], metrics["cost_per_success"]

    return score


VIRTUAL_PROBE = "virtual-time probe of the embedded-engine baseline"


def virtual_capacity(config: ExperimentConfig) -> float:
    """The baseline's time scale at capacity on the configured slice, simulated in virtual time (noise-free, as
    `replaybench plan` finds it). Why: the replay probe of an embedded-engine baseline takes minutes (3 min for a
    200-request slice of the Azure conversations on a 2-core box) where virtual time takes seconds; there the
    replays found 4.07x and virtual time 4.40x (no noise, no HTTP), so a virtual "65 %" is ~70 % of what replays
    measure. Only an embedded engine: a real server's capacity is measured.
    """
    import tempfile

    from harness.experiment.load import BASELINE, virtual_probe_problem
    from harness.experiment.plan import SimulatedSetup, simulated_baseline, simulated_capacity
    from harness.experiment.runner import load_trace
    from harness.sim.commands import DEFAULT_MODEL

    problem = virtual_probe_problem(config)
    if problem:
        raise UserError(problem)
    spec, _ = simulated_baseline(config.arm(BASELINE), DEFAULT_MODEL, "h200")  # its own args name its GPU
    score = score_result(config)
    with tempfile.TemporaryDirectory(prefix="replaybench-capacity-") as work:
        setup = SimulatedSetup(load_trace(config), spec, Path(work))
        return simulated_capacity(setup, lambda path: score(path)[0], config.slo.attainment_target)


def _open_run(
    console: Console, config_path: Path | None, run_dir: Path | None, output_dir: Path, arms: tuple[str, ...]
) -> tuple[ExperimentConfig, RunDir]:
    """The experiment (checked for the searched `arms`, ports fixed) and the run directory capacity.json goes into.

    An arm that is not searched need not be up: its server may still be starting beside the search."""
    from harness.experiment.check import run_checks
    from harness.experiment.config import ARMS, load_config, with_ports
    from harness.experiment.rundir import freeze_config, load_frozen, new_run_dir
    from harness.records.run_dir import RunDir

    if config_path is None and run_dir is None:
        raise UserError(
            "give --config EXPERIMENT.toml (or --run-dir RUN_DIR of a `replaybench run`); see configs/demo.toml"
        )
    if run_dir is not None and not run_dir.is_dir():
        raise UserError(f"--run-dir {run_dir}: no such directory; give a run directory made by `replaybench run`")
    config = load_config(config_path) if config_path is not None else load_frozen(run_dir)[0]
    # A search measures the capacity that a `[trace] load` is a share of, so the experiment's own load is moot.
    unloaded = config.trace.model_copy(update={"load": None, "capacity": None, "load_basis": None})
    config = config.model_copy(update={"trace": unloaded})
    failed = [f for f in run_checks(config) if f.level == "fail" and (f.topic in arms or f.topic not in ARMS)]
    if failed:
        raise UserError(
            f"preflight check failed ({len(failed)} problem(s)), first: {failed[0].message} (see `replaybench check`)"
        )
    config = with_ports(config)
    if run_dir is not None:
        return config, RunDir(run_dir)
    run = new_run_dir(output_dir, f"{config.name}-capacity")
    freeze_config(config, run)
    console.print(f"run directory: {run.root}")
    return config, run


def _print_summary(console: Console, config: ExperimentConfig, found: dict[str, Capacity], written: Path) -> None:
    from rich.markup import escape
    from rich.table import Table

    target = config.slo.attainment_target
    table = Table(
        title=f"capacity: largest time compression with every repeat at >= {target:.0%} SLO attainment",
        title_justify="left",
    )
    for column in (
        "arm",
        "max compression",
        "time scale",
        f"cost / success ({config.cost.currency})",
        "probes",
        "search",
    ):
        table.add_column(column, justify="right" if column != "arm" and column != "search" else "left")
    for arm, capacity in found.items():
        compression = capacity.max_time_compression
        cost = capacity.cost_per_success_at_capacity
        shown = "-" if compression is None else f"{'>= ' if capacity.limit == 'at_least' else ''}{compression:.2f}x"
        table.add_row(
            arm,
            shown,
            "-" if compression is None else f"{1 / compression:.3f}",
            "-" if cost is None else f"{cost:.3g}",
            str(len(capacity.probes)),
            escape(capacity.note),
        )
    console.print(table)
    console.print(f"capacity.json: {written}")


def capacity(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="experiment .toml")] = None,
    run_dir: Annotated[
        Path | None,
        typer.Option("--run-dir", help="add capacity.json to this run directory (its experiment.toml unless --config)"),
    ] = None,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="replays per probe; all must pass")] = 2,
    min_scale: Annotated[float, typer.Option("--min-scale", help="heaviest load tried (time scale)")] = 0.1,
    max_scale: Annotated[float, typer.Option("--max-scale", help="lightest load tried (time scale)")] = 1.0,
    tolerance: Annotated[float, typer.Option("--tolerance", help="stop when pass/fail scales are this close")] = 0.05,
    expand: Annotated[
        int,
        typer.Option(
            "--expand", min=0, help="step past a bound that held (failed) this many times, by the range's ratio"
        ),
    ] = 0,
    output_dir: Annotated[Path, typer.Option("--output-dir", help="where a new run directory goes")] = Path("reports"),
    arm: Annotated[
        str | None, typer.Option("--arm", help="search only this arm (baseline: all a [trace] load needs)")
    ] = None,
) -> None:
    """Per arm, the largest trace time compression (1 / time scale) at which SLO attainment stays at the config's
    attainment_target (bisection, repeats per probe) and the cost per successful request there -> capacity.json."""
    from rich.console import Console

    from harness.experiment.capacity import SearchBounds
    from harness.experiment.capacity_probe import CapacityFiles
    from harness.experiment.config import ARMS

    if arm is not None and arm not in ARMS:
        raise UserError(f"--arm {arm!r}: choose one of {', '.join(ARMS)}")
    searched = ARMS if arm is None else (arm,)
    bounds = SearchBounds(min_scale, max_scale, tolerance, expand)
    console = Console()
    experiment, run = _open_run(console, config, run_dir, output_dir, searched)
    found = search_capacity(console, experiment, run.root, searched, repeats, bounds)
    _print_summary(console, experiment, found, CapacityFiles(run.root).capacity_json)


def search_capacity(
    console: Console,
    experiment: ExperimentConfig,
    root: Path,
    arms: tuple[str, ...],
    repeats: int,
    bounds: SearchBounds,
) -> dict[str, Capacity]:
    """Search each arm's capacity with a progress bar and write root/capacity.json; Ctrl-C exits 130 (143)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from harness.atomic import atomic_path
    from harness.experiment.capacity import find_capacity
    from harness.experiment.capacity_probe import ArmProber, CapacityFiles
    from harness.experiment.runner import load_trace
    from harness.servers.cleanup import Terminated, termination_signals_raise

    files = CapacityFiles(root)
    kept = _other_arms(files.capacity_json, arms)
    trace = load_trace(experiment)
    per_arm = bounds.max_probes * repeats
    found: dict[str, Capacity] = {}
    columns = (TextColumn("{task.description:<26}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console) as progress, termination_signals_raise():
            task = progress.add_task("starting", total=len(arms) * per_arm)
            for index, arm in enumerate(arms):
                prober = ArmProber(
                    experiment,
                    arm,
                    trace,
                    files,
                    repeats,
                    score_result(experiment),
                    lambda what, done: progress.update(task, description=what, advance=done),
                )
                try:
                    found[arm] = find_capacity(prober.probe, bounds)
                finally:
                    prober.close()
                progress.update(task, completed=(index + 1) * per_arm)  # a search may end before its worst case
    except (KeyboardInterrupt, Terminated) as stop:
        console.print(
            f"[yellow]interrupted[/]: no capacity.json written; the probes so far are in {files.root / 'capacity'}"
        )
        raise SystemExit(128 + getattr(stop, "signum", signal.SIGINT)) from None
    target = experiment.slo.attainment_target
    with atomic_path(files.capacity_json) as tmp:
        tmp.write_text(json.dumps(kept | {arm: c.to_json(target) for arm, c in found.items()}, indent=2) + "\n")
    return found


def _other_arms(path: Path, searched: tuple[str, ...]) -> dict[str, object]:
    """The entries of an existing capacity.json for the arms not searched now, kept when it is rewritten (searching
    the candidate of a run must not drop the baseline's capacity its load was set from); checked before any probe."""
    if not path.exists():
        return {}
    try:
        existing = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise UserError(
            f"{path}: cannot read the capacity already there ({error}); move it aside to search anew"
        ) from None
    if not isinstance(existing, dict):
        raise UserError(f"{path}: not a capacity.json ({{arm: entry}}); move it aside to search anew")
    return {arm: entry for arm, entry in existing.items() if arm not in searched}


def register(app: typer.Typer) -> None:
    app.command("capacity")(capacity)
