"""`replaybench plan`: how many repeats at this load decide the target's margin, from simulated A/A repeats.

This is the CLI layer: it wires the simulated repeats (`plan.py`) to analysis (scoring each result file as the
report does, and the KEEP rule's power from `harness.analysis.planning`). Its output is labelled planning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.errors import UserError
from harness.sim.commands import FIT, NoisePhi, NoiseRun, NoiseShared, NoiseStep, NoiseSwitch


def plan(
    config: Annotated[Path, typer.Option("--config", "-c", help="experiment .toml")],
    load: Annotated[
        float | None, typer.Option("--load", help="share of the simulated baseline's capacity [config's load]")
    ] = None,
    pairs: Annotated[int, typer.Option("--pairs", min=3, help="simulated A/A repeats that measure the noise")] = 8,
    effect: Annotated[
        float | None, typer.Option("--effect", help="true improvement to plan for, a fraction [2 x margin]")
    ] = None,
    power: Annotated[float | None, typer.Option("--power", help="wanted probability of KEEP [decision.power]")] = None,
    repeats: Annotated[
        int | None, typer.Option("--repeats", min=2, help="repeats to show the power of [config's]")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="noise seed of the simulated repeats")] = 0,
    gpu: Annotated[
        str, typer.Option("--gpu", help="simulated GPU when the baseline is not the embedded engine")
    ] = "h200",
    noise: NoiseSwitch = True,
    noise_shared: NoiseShared = FIT.shared_sd,
    noise_run: NoiseRun = FIT.run_sd,
    noise_step: NoiseStep = FIT.step_sd,
    noise_phi: NoisePhi = FIT.step_phi,
) -> None:
    """PLANNING, not evidence: simulate A/A repeats of the baseline with calibrated noise at the configured load
    (a share of its simulated capacity), and print how many repeats the KEEP rule needs for the target."""
    import math
    import tempfile

    import numpy as np
    from rich.console import Console

    from harness.analysis.planning import keep_power, repeats_to_keep, sd_interval, smallest_kept_effect
    from harness.analysis.run_metrics import TimeBlocks, load_run
    from harness.experiment.config import MAX_LOAD, load_config
    from harness.experiment.plan import SimulatedSetup, aa_log_ratios, simulated_baseline, simulated_capacity
    from harness.experiment.runner import load_trace
    from harness.sim.commands import DEFAULT_MODEL, noise_model

    experiment = load_config(config)
    share = load if load is not None else experiment.trace.load
    if share is not None and not 0 < share <= MAX_LOAD:
        raise UserError(f"--load {share:g} must be above 0 and at most {MAX_LOAD:g} (a share of capacity: 0.65 = 65 %)")
    target = experiment.decision.target
    alpha = experiment.decision.alpha
    wanted = power if power is not None else experiment.decision.power
    improvement = effect if effect is not None else 2 * target.margin
    if not improvement > target.margin:
        raise UserError(
            f"--effect {improvement:g} must exceed the target's margin {target.margin:g}: KEEP needs the CI beyond "
            "the margin, so a true change at the margin is kept at most alpha/2 of the time"
        )
    if not 0 < wanted < 1:
        raise UserError(f"--power {wanted:g} must be between 0 and 1 (0.8 = 80 %)")
    steps = noise_model(noise, noise_shared, noise_run, noise_step, noise_phi)
    spec, engine = simulated_baseline(experiment.arm("baseline"), DEFAULT_MODEL, gpu)
    n = repeats or experiment.repeats
    console = Console()

    def score(path: Path) -> dict[str, float]:
        blocks = TimeBlocks(0.0, 1.0, 1)
        return load_run(path, blocks, experiment.slo, experiment.decision, experiment.cost).comparable

    with tempfile.TemporaryDirectory(prefix="replaybench-plan-") as work:
        setup = SimulatedSetup(load_trace(experiment), spec, Path(work), score)
        with console.status("simulating the baseline's capacity and A/A repeats (virtual time) ..."):
            at_capacity = simulated_capacity(setup, experiment.slo.attainment_target)
            time_scale = at_capacity / share if share is not None else experiment.trace.time_scale
            ratios = aa_log_ratios(setup, time_scale, steps, seed, pairs, target.metric)
    sd = float(np.std(ratios, ddof=1))
    low, high = sd_interval(sd, pairs)
    log_effect = math.log1p(improvement)

    def needed(noise_sd: float) -> str:
        count = repeats_to_keep(noise_sd, log_effect, target.margin, alpha, wanted)
        return "more than 100" if count is None else str(count)

    kept_at_n = smallest_kept_effect(n, sd, target.margin, alpha, wanted)
    for line in (
        f"[bold]PLANNING[/] (simulated A/A, not evidence): {experiment.name}",
        f"  engine: {engine}; step-time noise {steps.describe()}",
        f"  load: {at_capacity / time_scale:.0%} of the simulated baseline's capacity (time scale {time_scale:.4g}; "
        f"capacity at {at_capacity:.4g}, noise-free)",
        f"  {target.metric}: paired sd of log(candidate / baseline) {sd:.4f} over {pairs} A/A repeats "
        f"(95 % CI of the sd {low:.4f} to {high:.4f})",
        f"  rule: KEEP needs the {1 - alpha:.0%} CI of {target.metric} beyond its {target.margin:.0%} margin "
        "(gates must pass too, so KEEP's power is at most this)",
        f"  repeats needed: {needed(sd)} to KEEP a true {improvement:.0%} improvement with {wanted:.0%} power "
        f"({needed(high)} if the sd is at its upper bound)",
        f"  with {n} repeats: power {keep_power(n, sd, log_effect, target.margin, alpha):.2f}; the smallest true "
        f"improvement kept with {wanted:.0%} power is {math.expm1(kept_at_n):.1%}",
    ):
        console.print(line, soft_wrap=True, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
