"""Energy per successful request: a run's GPU energy from the power sampled beside it (analysis/energy.py), the
metric, its paired comparison and the cost section's line, on synthetic run directories with telemetry files."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import tomli_w

from harness.analysis.analyse import analyse_run_dir
from harness.analysis.energy import run_energy
from harness.records.result_io import read_results, write_results
from harness.records.result_schema import META_T0_UNIX
from harness.records.run_dir import RunDir
from tests.support.synthetic_results import Scenario, write_run_dir

T0_UNIX = 1_800_000_000.0  # the replay's trace time 0 on the wall clock
TELEMETRY_T0 = T0_UNIX - 5.0  # sampling began 5 s before: prompts were prepared meanwhile


def telemetry(
    path: Path,
    watts: dict[int, float],
    gpus: list[int],
    span_s: float,
    error: str | None = None,
    counted: dict[int, float] | None = None,
) -> None:
    """A telemetry file as RunTelemetry writes it: one sample a second per GPU from its start, idle (60 W) for the
    first 5 s and `watts[gpu]` after; with `counted`, energy counter reads too, of a GPU drawing `counted[gpu]`
    from the start (what the samples missed)."""
    seconds = range(int(span_s) + 7)
    samples = [
        {"t_s": float(t), "index": float(gpu), "power_w": 60.0 if t < 5 else watts[gpu]}
        for t in seconds
        for gpu in watts
    ]
    reads = [
        {"t_s": float(t), "index": float(gpu), "energy_mj": 9e9 + w * t * 1e3}
        for t in seconds
        for gpu, w in (counted or {}).items()
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"interval_s": 1.0, "t0_unix": TELEMETRY_T0, "gpus": gpus, "host": [], "gpu": samples, "energy": reads}
    path.write_text(json.dumps(payload | {"gpu_error": error}))


def test_energy_is_each_gpus_mean_power_in_the_window_times_the_window(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    telemetry(path, {0: 400.0, 1: 300.0, 2: 900.0}, gpus=[0, 1], span_s=60)
    window = (T0_UNIX + 2.0, T0_UNIX + 42.0)  # 40 s, all past the idle start
    assert run_energy(path, window).joules == pytest.approx((400 + 300) * 40)  # GPU 2 is another arm's
    # a window reaching back into the idle preparation takes its samples (one interval either side)
    low = run_energy(path, (T0_UNIX - 3.0, T0_UNIX + 7.0)).joules
    assert low is not None and 60 * 2 * 10 < low < 400 * 10 + 300 * 10


def test_the_energy_counter_is_preferred_and_interpolated_to_the_window(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    telemetry(path, {0: 400.0, 1: 300.0}, gpus=[0, 1], span_s=60, counted={0: 650.0, 1: 500.0, 2: 900.0})
    window = (T0_UNIX + 2.25, T0_UNIX + 42.5)  # between the reads: interpolated
    energy = run_energy(path, window)
    assert energy.source == "NVML energy counter" and energy.joules == pytest.approx((650 + 500) * 40.25)
    # the reads end 66 s after sampling began: a window past them falls back to the samples for every GPU
    late = run_energy(path, (T0_UNIX + 50.0, T0_UNIX + 70.0))
    assert late.source == "board power sampled once a second" and late.joules == pytest.approx((400 + 300) * 20)
    # a counter read only for some of the arm's GPUs is not used either
    telemetry(path, {0: 400.0, 1: 300.0}, gpus=[0, 1], span_s=60, counted={0: 650.0})
    assert run_energy(path, window).joules == pytest.approx((400 + 300) * 40.25)


def test_an_unmeasurable_run_says_why(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    window = (T0_UNIX, T0_UNIX + 10.0)
    telemetry(path, {0: 400.0}, gpus=[], span_s=20)
    assert run_energy(path, window).reason == "the arm's GPUs are not known: give the arm `gpus` to measure its energy"
    telemetry(path, {0: 400.0}, gpus=[0, 3], span_s=20)
    assert run_energy(path, window).reason == "GPU 3 not sampled (no power samples in the run's window)"
    telemetry(path, {}, gpus=[0], span_s=20, error="nvidia-smi not found: GPUs not sampled")
    assert run_energy(path, window).reason == "no GPU sampled: nvidia-smi not found: GPUs not sampled"
    telemetry(path, {}, gpus=[], span_s=20, error="nvidia-smi not found: GPUs not sampled")  # a laptop, CI
    assert run_energy(path, window).reason == "no GPU sampled: nvidia-smi not found: GPUs not sampled"
    assert run_energy(path, None).joules is None
    assert "written before energy" in run_energy(tmp_path / "absent.json", window).reason


def with_telemetry(
    run: RunDir, watts: dict[str, float], gpus: list[int], counted: dict[str, float] | None = None
) -> None:
    """Give every result file of `run` its start time and a telemetry file drawing `watts[arm]` on GPU 0 (and,
    with `counted`, counter reads of `counted[arm]`)."""
    for path in sorted(run.root.glob("results/*.parquet")):
        table, meta = read_results(path)
        write_results(path, table, meta | {META_T0_UNIX: repr(T0_UNIX)})
        arm, repeat = meta["replaybench.arm"], int(meta["replaybench.repeat"])
        reads = None if counted is None else {0: counted[arm]}
        telemetry(run.telemetry(arm, repeat), {0: watts[arm]}, gpus=gpus, span_s=200, counted=reads)


CONFIG = {"decision": {"target": {"metric": "tpot_p50", "margin": 0.05}, "exploratory": ["energy_per_success"]}}


def test_energy_per_success_is_compared_and_shown_with_the_cost(tmp_path: Path) -> None:
    run = write_run_dir(tmp_path, Scenario(config=CONFIG, repeats=3, requests=400, seed=4))
    with_telemetry(run, {"baseline": 400.0, "candidate": 300.0}, gpus=[0])
    summary = analyse_run_dir(run.root).summary
    row = next(r for r in summary.runs if r.arm == "baseline")
    assert row.metrics["energy_per_success"] == pytest.approx(400.0 * row.duration_s / row.successes, rel=1e-6)
    energy = next(c for c in summary.comparisons if c.metric == "energy_per_success")
    assert energy.role == "exploratory" and energy.ratio == pytest.approx(0.75, abs=0.01)  # same durations
    assert summary.cost.candidate_energy_per_success_j < summary.cost.baseline_energy_per_success_j
    assert summary.cost.energy_line.startswith("baseline ") and "(-25" in summary.cost.energy_line
    assert "each arm's GPUs, board power sampled once a second" in summary.cost.energy_line
    assert "USD/kWh" not in summary.cost.energy_line  # no price given: joules only
    config = tomllib.loads(run.experiment_toml.read_text())
    config["cost"] = {"energy_price_per_kwh": 0.2, "currency": "EUR"}
    run.experiment_toml.write_text(tomli_w.dumps(config))
    cost = analyse_run_dir(run.root).summary.cost
    priced = f"{cost.baseline_energy_per_success_j / 3.6e6 * 0.2:.3g}"
    assert f"; at 0.2 EUR/kWh {priced} and " in cost.energy_line and cost.energy_line.endswith(
        "EUR per successful request"
    )


def test_without_placed_gpus_energy_is_not_measured_and_the_report_says_why(tmp_path: Path) -> None:
    run = write_run_dir(tmp_path, Scenario(config=CONFIG, repeats=2, requests=200, seed=5))
    with_telemetry(run, {"baseline": 400.0, "candidate": 300.0}, gpus=[])
    summary = analyse_run_dir(run.root).summary
    energy = next(c for c in summary.comparisons if c.metric == "energy_per_success")
    assert energy.ratio is None and energy.note == "not measured in any repeat pair"
    assert summary.cost.energy_line == (
        "not measured (the arm's GPUs are not known: give the arm `gpus` to measure its energy)"
    )


def test_the_cost_line_names_the_counter_when_every_run_read_it(tmp_path: Path) -> None:
    run = write_run_dir(tmp_path, Scenario(config=CONFIG, repeats=2, requests=200, seed=6))
    watts = {"baseline": 100.0, "candidate": 100.0}  # what the samples say: no change
    with_telemetry(run, watts, gpus=[0], counted={"baseline": 600.0, "candidate": 450.0})
    cost = analyse_run_dir(run.root).summary.cost
    assert cost.candidate_energy_per_success_j / cost.baseline_energy_per_success_j == pytest.approx(0.75, abs=0.02)
    assert cost.energy_line.endswith("each arm's GPUs, NVML energy counter")
