"""`replaybench plan`: how many repeats at this load decide the target's margin, from simulated A/A repeats.

This is the CLI layer: it wires the simulated repeats (`plan.py`) to analysis (scoring each result file as the
report does, and the KEEP rule's power, gates included, from `harness.analysis.paired_stats`). Its output is
labelled planning.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from harness.errors import UserError
from harness.sim.commands import FIT, NoisePhi, NoiseRun, NoiseShared, NoiseStep, NoiseSwitch

if TYPE_CHECKING:
    from harness.analysis.run_metrics import RunMetrics
    from harness.records.decision_config import DecisionConfig

LOOK_PATHS = 50_000  # simulated runs behind the sequential looks' line: its shares' SE is under a quarter point


def plan(
    config: Annotated[Path, typer.Option("--config", "-c", help="experiment .toml")],
    load: Annotated[
        float | None, typer.Option("--load", help="share of the simulated baseline's capacity [config's load]")
    ] = None,
    pairs: Annotated[int, typer.Option("--pairs", min=3, help="simulated A/A repeats that measure the noise")] = 8,
    effect: Annotated[
        float | None, typer.Option("--effect", help="true improvement to plan for, a fraction [decision's]")
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
    import numpy as np
    from rich.console import Console

    from harness.analysis.compare import estimator_of, log_ratios
    from harness.analysis.decision import confidence_level
    from harness.analysis.look_levels import at_look
    from harness.analysis.paired_stats import detectable_effect, keep_power, repeats_to_keep, sd_uncertainty
    from harness.analysis.planning import MOST_REPEATS
    from harness.analysis.run_metrics import TimeBlocks, load_run
    from harness.experiment.config import MAX_LOAD, load_config
    from harness.experiment.plan import SimulatedSetup, aa_repeats, simulated_baseline, simulated_capacity
    from harness.experiment.runner import load_trace
    from harness.sim.commands import DEFAULT_MODEL, noise_model

    experiment = load_config(config)
    # with sequential looks, plan for the last look's level: the power the full run has (earlier looks add a little)
    decision = at_look(experiment.decision, experiment.repeats)
    share = load if load is not None else experiment.trace.load
    if share is not None and not 0 < share <= MAX_LOAD:
        raise UserError(f"--load {share:g} must be above 0 and at most {MAX_LOAD:g} (a share of capacity: 0.65 = 65 %)")
    rules = decision.decision_rules
    margins = np.array([rule.margin for rule in rules])
    improvement = effect if effect is not None else decision.assumed_effect
    if not improvement > margins[0]:
        raise UserError(
            f"--effect {improvement:g} must exceed the target's margin {margins[0]:g}: KEEP needs the CI beyond "
            "the margin, so a true change at the margin is kept at most alpha/2 of the time"
        )
    wanted = power if power is not None else decision.power
    if not 0 < wanted < 1:
        raise UserError(f"--power {wanted:g} must be between 0 and 1 (0.8 = 80 %)")
    steps = noise_model(noise, noise_shared, noise_run, noise_step, noise_phi)
    spec, engine = simulated_baseline(experiment.arm("baseline"), DEFAULT_MODEL, gpu)
    n = repeats or experiment.repeats
    console = Console()

    def scored(path: Path) -> RunMetrics:
        return load_run(path, TimeBlocks(0.0, 1.0, 1), experiment.slo, decision, experiment.cost)

    def attainment(path: Path) -> float:
        return scored(path).metrics["slo_attainment"]

    names = [rule.metric for rule in rules]
    estimators = [estimator_of(name, decision) for name in names]
    with tempfile.TemporaryDirectory(prefix="replaybench-plan-") as work:
        setup = SimulatedSetup(load_trace(experiment), spec, Path(work))
        with console.status("simulating the baseline's capacity and A/A repeats (virtual time) ..."):
            at_capacity = simulated_capacity(setup, attainment, experiment.slo.attainment_target)
            time_scale = at_capacity / share if share is not None else experiment.trace.time_scale
            files = aa_repeats(setup, time_scale, steps, seed, pairs)
            ratios = log_ratios([(scored(b), scored(c)) for b, c in files], names, estimators)
    if not np.isfinite(ratios).all():
        undefined = ", ".join(name for name, row in zip(names, ratios, strict=True) if not np.isfinite(row).all())
        raise UserError(f"{undefined}: undefined in a simulated repeat; plan at a lighter --load or change [decision]")
    sds = [float(sd) for sd in np.std(ratios, axis=1, ddof=1)]
    target_sd, gate_sds = sds[0], np.array(sds[1:])
    keep, parts = keep_power(improvement, target_sd, gate_sds, np.array(n), margins, decision.alpha)
    low, high = sd_uncertainty(pairs, decision.alpha)

    def needed(gates: np.ndarray, gate_margins: np.ndarray) -> str:
        count = repeats_to_keep(improvement, target_sd, gates, gate_margins, decision.alpha, wanted, MOST_REPEATS)
        return f"more than {MOST_REPEATS}" if count is None else str(count)

    noise_text = ", ".join(
        f"{rule.metric} {sd:.4f} ({'target' if index == 0 else 'gate'} ±{rule.margin:.0%}, {estimator.value})"
        for index, (rule, sd, estimator) in enumerate(zip(rules, sds, estimators, strict=True))
    )
    target = rules[0].metric
    for line in (
        f"[bold]PLANNING[/] (simulated A/A, not evidence): {experiment.name}",
        f"  engine: {engine}; step-time noise {steps.describe()}",
        f"  load: {at_capacity / time_scale:.0%} of the simulated baseline's capacity (time scale {time_scale:.4g}; "
        f"capacity at {at_capacity:.4g}, noise-free)",
        f"  noise: sd of the per-repeat log-ratio over {pairs} A/A repeats: {noise_text}; the true sd may be "
        f"×{low:.2g}-{high:.2g} of these",
        f"  rule: KEEP needs {target}'s {confidence_level(decision.alpha)} CI beyond its margin and every gate's "
        "inside its own",
        f"  repeats needed: {needed(gate_sds, margins)} to KEEP a true {improvement:.0%} improvement with "
        f"{wanted:.0%} power (the target alone: {needed(np.array([]), margins[:1])})",
        f"  with {n} repeats: P(KEEP) {float(keep):.2f} (target {float(parts[0]):.2f}, gates "
        f"{float(np.prod(parts[1:])):.2f}); {target}'s CI clears its margin with {wanted:.0%} power from a true "
        f"improvement of {detectable_effect(target_sd, n, margins[0], decision.alpha, wanted):.1%}",
        *_looks_lines(experiment.decision, improvement, margins[0], target_sd, seed),
    ):
        console.print(line, soft_wrap=True, highlight=False)


def _looks_lines(declared: DecisionConfig, improvement: float, margin: float, target_sd: float, seed: int) -> list[str]:
    """With sequential looks: how often the target's CI clears its margin by the last look, and the repeats a run
    takes on average when it stops at the first look that clears (the target alone: gates and REJECT aside)."""
    import numpy as np

    from harness.analysis.look_levels import first_crossing, levels_of, looks_rule_text, t_paths

    if not declared.looks or target_sd <= 0:
        return []
    shift = (np.log1p(improvement) - np.log1p(margin)) / target_sd  # in repeat SDs beyond the margin
    t = t_paths(declared.looks, float(shift), LOOK_PATHS, seed)
    cleared, mean_repeats = first_crossing(declared.looks, levels_of(declared), t, two_sided=False)
    return [
        f"  {looks_rule_text(declared)}: the target's CI clears its margin by the last look in {cleared:.0%} of "
        f"simulated runs, which stop after {mean_repeats:.1f} repeats on average (the target alone)"
    ]


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
