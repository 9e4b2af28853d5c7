"""The decision rule on the noisy embedded engine: an A/A raises false alarms at the nominal rate, and a 10 %
faster step at 65 % of capacity is kept as often as the planner predicts.

The engine runs in virtual time with the calibrated H200 noise. A pool of repeats (baseline, an identical
twin, and the twin with every step 10 % faster, all three sharing the repeat's noise factor) is simulated once;
experiments are 5 repeats drawn from the pool without replacement, the review's method
(../shared/research/decision_validity.md §3), so the Monte-Carlo error is that of the experiments drawn,
plus the pool's own (a few points, included in the tolerance).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.analysis.compare import estimator_of, log_ratios
from harness.analysis.gate_rule import gate_outcomes
from harness.analysis.paired_stats import keep_power, t_interval
from harness.analysis.run_metrics import RunMetrics, TimeBlocks, load_run
from harness.experiment.plan import SimulatedSetup, simulated_baseline, simulated_capacity
from harness.experiment.runner import load_trace
from harness.records.decision_config import DecisionConfig, MetricRule
from harness.sim.commands import DEFAULT_MODEL
from harness.sim.noise import NoiseModel
from tests.experiment.support import config_dict, write_config

ALPHA, LOAD, POOL, EXPERIMENTS, REPEATS = 0.05, 0.65, 40, 200, 5
TARGET = "tpot_p50"


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """Per pool repeat, the target's log-ratio of the twin and of the faster twin against the baseline."""
    from harness.experiment.config import load_config

    root = tmp_path_factory.mktemp("calibration")
    trace = Path(__file__).resolve().parents[2] / "traces" / "azure-conv-2023.parquet"
    document = config_dict(trace)
    document["trace"] = {"path": str(trace), "start_s": 600.0, "duration_s": 60.0}
    experiment = load_config(write_config(root / "experiment.toml", document))
    spec, _ = simulated_baseline(experiment.arm("baseline"), DEFAULT_MODEL, "h200")
    decision = DecisionConfig(target=MetricRule(metric=TARGET, margin=0.05), gate=[])
    setup = SimulatedSetup(load_trace(experiment), spec, root)

    def scored(path: Path) -> RunMetrics:
        return load_run(path, TimeBlocks(0.0, 1.0, 1), experiment.slo, decision, experiment.cost)

    capacity = simulated_capacity(setup, lambda p: scored(p).metrics["slo_attainment"], 0.9)
    scale, noise, estimator = capacity / LOAD, NoiseModel(), [estimator_of(TARGET, decision)]
    ratios: dict[str, list[float]] = {"twin": [], "faster": []}
    for repeat in range(POOL):
        baseline = scored(setup.run(scale, noise, 0, repeat, "baseline"))
        for name, step_scale in (("twin", 1.0), ("faster", 0.9)):
            candidate = scored(setup.run(scale, noise, 0, repeat, "candidate", step_scale))
            ratios[name].append(float(log_ratios([(baseline, candidate)], [TARGET], estimator)[0, 0]))
    return {name: np.array(values) for name, values in ratios.items()}


def experiments(values: np.ndarray, seed: int) -> np.ndarray:
    """EXPERIMENTS draws of REPEATS pool entries each (without replacement within an experiment)."""
    rng = np.random.default_rng(seed)
    return np.stack([values[rng.choice(len(values), REPEATS, replace=False)] for _ in range(EXPERIMENTS)])


def test_simulated_aa_raises_false_alarms_at_the_nominal_rate(pool: dict[str, np.ndarray]) -> None:
    w = experiments(pool["twin"], seed=1)
    _, _, low, high = t_interval(w, ALPHA)
    excludes_zero = float(((low > 0) | (high < 0)).mean())
    mc_error = 3 * np.sqrt(ALPHA * (1 - ALPHA) / EXPERIMENTS)
    assert abs(excludes_zero - ALPHA) <= mc_error, excludes_zero
    outcomes = gate_outcomes(w[:, None, :], np.array([0.05]), ALPHA)  # the rule itself never decides an A/A
    assert not np.isin(outcomes, ["KEEP", "REJECT"]).any()


def test_a_ten_percent_faster_step_is_kept_as_often_as_planned(pool: dict[str, np.ndarray]) -> None:
    faster = pool["faster"]
    effect = float(np.expm1(-faster.mean()))  # the true TPOT gain at this load, from the whole pool
    predicted, _ = keep_power(effect, float(faster.std(ddof=1)), np.array([]), REPEATS, np.array([0.05]), ALPHA)
    kept = float((gate_outcomes(experiments(faster, seed=2)[:, None, :], np.array([0.05]), ALPHA) == "KEEP").mean())
    assert effect > 0.05  # at 65 % of capacity a 10 % faster step shows as more than the margin
    assert abs(kept - float(predicted)) <= 0.10, (kept, float(predicted), effect)
