"""Calibrated step-time noise: deterministic per (seed, repeat, arm), shared across the arms of a repeat, and
enough to give a simulated A/A a CI of non-zero width."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from harness.analysis.analyse import analyse_run_dir
from harness.errors import UserError
from harness.records.result_io import read_results
from harness.records.run_dir import RunDir
from harness.sim.engine_spec import build_spec
from harness.sim.noise import NO_NOISE, NoiseModel, StepNoise, step_noise
from harness.sim.simulate import META_SIM_NOISE, simulate_trace, write_simulated_results
from harness.sim.state_policy import StatePolicy
from harness.trace.model import Trace
from tests.sim.support import REPO
from tests.trace.support import replaybench

AZURE_CONV = REPO / "traces/azure-conv-2023.parquet"
MODEL = REPO / "configs/models/nemotron-h-8b.json"
FIT = NoiseModel()


def factors(noise: StepNoise, steps: int) -> np.ndarray:
    return np.array([noise.factor() for _ in range(steps)])


def test_the_same_seed_repeat_and_arm_give_the_same_steps() -> None:
    first, again = StepNoise(FIT, 7, 3, "baseline"), StepNoise(FIT, 7, 3, "baseline")
    assert np.array_equal(factors(first, 500), factors(again, 500))
    other_arm, other_repeat = StepNoise(FIT, 7, 3, "candidate"), StepNoise(FIT, 7, 4, "baseline")
    # both arms of a repeat share its factor; their own parts differ
    assert other_arm.shared == first.shared and other_arm.run != first.run
    assert not np.array_equal(factors(other_arm, 500), factors(StepNoise(FIT, 7, 3, "baseline"), 500))
    # another repeat (or seed) draws another shared factor
    assert other_repeat.shared != first.shared and StepNoise(FIT, 8, 3, "baseline").shared != first.shared


def test_the_step_jitter_is_the_ar1_the_model_asks_for() -> None:
    noise = StepNoise(FIT, 0, 0, "baseline")
    e = np.log(factors(noise, 40_000)) - noise.shared - noise.run
    assert np.std(e) == pytest.approx(FIT.step_sd, rel=0.1)
    assert np.corrcoef(e[:-1], e[1:])[0, 1] == pytest.approx(FIT.step_phi, abs=0.02)
    shared = [StepNoise(FIT, 0, repeat, "a").shared for repeat in range(2000)]
    assert np.std(shared) == pytest.approx(FIT.shared_sd, rel=0.1)


def test_off_means_deterministic_and_bad_sizes_are_refused() -> None:
    assert step_noise(NO_NOISE, 0, 0, "baseline") is None and not NO_NOISE.enabled
    with pytest.raises(UserError, match=r"--noise-shared -0.1 must be in \[0, 1\)"):
        NoiseModel(shared_sd=-0.1)
    with pytest.raises(UserError, match=r"--noise-phi 1 must be in \(-1, 1\)"):
        NoiseModel(step_phi=1.0)


@pytest.fixture(scope="module")
def azure_slice() -> Trace:
    return Trace.read(AZURE_CONV).slice(start_s=600, limit=200)


def test_simulate_cli_is_reproducible_with_noise_and_records_it(tmp_path: Path) -> None:
    trace = tmp_path / "slice.parquet"
    Trace.read(AZURE_CONV).slice(start_s=600, limit=120).write(trace)

    def simulate(name: str, *extra: str) -> Path:
        out = tmp_path / f"{name}.parquet"
        done = replaybench("simulate", str(trace), "-o", str(out), "--time-scale", "0.4", *extra)
        assert done.returncode == 0, done.stderr
        return out

    first, again = simulate("a", "--arm", "baseline"), simulate("b", "--arm", "baseline")
    other_arm, off = simulate("c", "--arm", "candidate"), simulate("d", "--arm", "baseline", "--no-noise")
    columns = ["request_id", "ttft_s", "e2e_s", "token_times"]
    assert pq.read_table(first, columns=columns).equals(pq.read_table(again, columns=columns))
    assert not pq.read_table(first, columns=columns).equals(pq.read_table(other_arm, columns=columns))
    assert not pq.read_table(first, columns=columns).equals(pq.read_table(off, columns=columns))
    recorded = json.loads(read_results(first)[1][META_SIM_NOISE])
    assert recorded | {"shared": 0, "run": 0} == {
        "shared_sd": 0.025,
        "run_sd": 0.008,
        "step_sd": 0.07,
        "step_phi": 0.9,
        "seed": 0,
        "repeat": 0,
        "arm": "baseline",
        "shared": 0,
        "run": 0,
        "step_scale": 1.0,
    }
    assert json.loads(read_results(other_arm)[1][META_SIM_NOISE])["shared"] == recorded["shared"]
    assert read_results(off)[1][META_SIM_NOISE] == "off"


def _aa_run_dir(root: Path, trace: Trace, model: NoiseModel, repeats: int) -> RunDir:
    """A run directory of simulated A/A repeats (both arms the baseline policy) with a declared decision rule."""
    spec = build_spec(MODEL, "h200", StatePolicy("baseline", "float32", 16, False))
    run = RunDir(root)
    root.mkdir()
    (root / "experiment.toml").write_text(
        'name = "sim-aa"\nmode = "A/A"\n[slo]\nttft_s = 2.0\ntpot_s = 0.05\n'
        '[decision]\ntarget = { metric = "tpot_p50", margin = 0.05 }\n'
    )
    for repeat in range(repeats):
        for arm in ("baseline", "candidate"):
            noise = step_noise(model, 0, repeat, arm)
            result = simulate_trace(trace, spec, 0.4, noise=noise)
            write_simulated_results(run.result(arm, repeat), result, spec, AZURE_CONV, arm, repeat, 0.4, noise)
    return run


def test_a_simulated_aa_with_noise_has_a_ci_of_nonzero_width(tmp_path: Path, azure_slice: Trace) -> None:
    noisy = analyse_run_dir(_aa_run_dir(tmp_path / "noisy", azure_slice, FIT, 3).root).summary
    tpot = next(c for c in noisy.comparisons if c.metric == "tpot_p50")
    assert tpot.ci_low is not None and tpot.ci_high is not None
    assert tpot.ci_low < tpot.ratio < tpot.ci_high and tpot.ci_high - tpot.ci_low > 0.005
    assert len(set(tpot.baseline)) == 3 and tpot.baseline != tpot.candidate
    # without noise the two arms are the same run: a degenerate CI of zero width
    exact = analyse_run_dir(_aa_run_dir(tmp_path / "exact", azure_slice, NO_NOISE, 3).root).summary
    flat = next(c for c in exact.comparisons if c.metric == "tpot_p50")
    assert flat.baseline == flat.candidate and math.isclose(flat.ci_low, flat.ci_high)


def test_step_scale_is_a_what_if_on_top_of_the_noise() -> None:
    plain, faster = StepNoise(FIT, 7, 3, "candidate"), StepNoise(FIT, 7, 3, "candidate", step_scale=0.9)
    assert np.allclose(factors(faster, 200), 0.9 * factors(plain, 200))
    quiet = step_noise(NO_NOISE, 0, 0, "candidate", step_scale=0.9)
    assert quiet is not None and quiet.factor() == pytest.approx(0.9)
    assert step_noise(NO_NOISE, 0, 0, "candidate") is None
    with pytest.raises(UserError, match="--step-scale 0 must be > 0"):
        StepNoise(FIT, 0, 0, "candidate", step_scale=0.0)
