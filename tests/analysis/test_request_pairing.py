"""The request-paired p50 estimator on real result files: pairs by request id, skips failures, is named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from harness.analysis.analyse import analyse_run_dir, time_blocks
from harness.analysis.model import Estimator
from harness.analysis.request_pairing import median_log_ratios
from harness.analysis.run_metrics import load_run
from harness.records.decision_config import AnalysisConfig
from harness.records.result_io import read_results, write_results
from harness.records.result_schema import META_ARM
from harness.records.run_dir import RunDir
from tests.support.synthetic_results import Scenario, write_run_dir

PAIRED = ["ttft_p50", "tpot_p50", "e2e_p50"]
CONFIG = {"decision": {"target": {"metric": "tpot_p50", "margin": 0.05}, "exploratory": ["ttft_p50", "e2e_p50"]}}


def _set(table: pa.Table, name: str, values: pa.Array | pa.ChunkedArray) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


def scaled_copy(run: RunDir, repeat: int, factor: float, rng: np.random.Generator, fail: int = 0) -> None:
    """Make the candidate of `repeat` the baseline with every request's latencies times `factor`, rows in a
    random order, and the first `fail` requests (by id) failed with absurd latencies."""
    table, meta = read_results(run.result("baseline", repeat))
    times = table.column("token_times").combine_chunks()
    scaled_times = pa.ListArray.from_arrays(
        times.offsets, pc.multiply(times.flatten(), pa.scalar(factor, pa.float32()))
    )
    table = _set(table, "token_times", scaled_times)
    for name in ("ttft_s", "e2e_s"):
        table = _set(table, name, pc.multiply(table.column(name), factor))
    failed = np.arange(table.num_rows) < fail
    table = _set(table, "error", pa.array(np.where(failed, "http_5xx", None).tolist(), pa.string()))
    table = _set(table, "ttft_s", pa.array(np.where(failed, 99.0, table.column("ttft_s").to_numpy())))
    table = _set(table, "arm", pa.array(["candidate"] * table.num_rows))
    write_results(
        run.result("candidate", repeat), table.take(rng.permutation(table.num_rows)), meta | {META_ARM: "candidate"}
    )


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    run = write_run_dir(
        tmp_path_factory.mktemp("scaled"),
        Scenario(repeats=3, requests=600, failure_rate=0.0, config=json.loads(json.dumps(CONFIG)), seed=21),
    )
    rng = np.random.default_rng(0)
    for repeat in range(3):
        scaled_copy(run, repeat, 0.9, rng, fail=350)
    return run


def _load(run: RunDir, arm: str, repeat: int):
    blocks = time_blocks([run.result(arm, repeat)], 10.0)
    config = AnalysisConfig()
    return load_run(run.result(arm, repeat), blocks, config.slo, config.decision, config.cost)


def test_every_request_ten_percent_faster_gives_exactly_that_median_ratio(scaled: RunDir) -> None:
    # Rows are shuffled and 350 of 600 requests failed with a 99 s TTFT in the candidate: pairing by request id and
    # skipping failures leaves log(0.9) for every request, so the median is exact.
    ratios = median_log_ratios(_load(scaled, "baseline", 0), _load(scaled, "candidate", 0), PAIRED)
    for metric in PAIRED:
        assert ratios[metric] == pytest.approx(np.log(0.9), abs=1e-6), metric


def test_run_dir_comparisons_name_their_estimator_and_are_exact(scaled: RunDir) -> None:
    summary = analyse_run_dir(scaled.root).summary
    by_metric = {c.metric: c for c in summary.comparisons}
    for metric in PAIRED:
        c = by_metric[metric]
        assert c.estimator is Estimator.REQUEST_PAIRED
        assert c.ratio == pytest.approx(0.9, abs=1e-6) and c.sd == pytest.approx(0.0, abs=1e-6)
    assert by_metric["ttft_p99"].estimator is Estimator.RUN_QUANTILE
    assert by_metric["slo_attainment"].estimator is Estimator.RUN_RATIO
    # a per-run quantile is over each arm's own successes, so the failures move the candidate's TTFT p99
    assert by_metric["ttft_p99"].ratio != pytest.approx(0.9, abs=1e-3)


def test_pairing_can_be_switched_off_and_then_compares_per_run_p50s(tmp_path: Path) -> None:
    config = json.loads(json.dumps(CONFIG))
    config["decision"]["request_paired"] = False
    run = write_run_dir(tmp_path, Scenario(repeats=3, requests=600, itl_factor=0.8, config=config, seed=22))
    summary = analyse_run_dir(run.root).summary
    target = summary.comparisons[0]
    assert target.estimator is Estimator.RUN_QUANTILE
    expected = np.exp(np.mean(np.log(np.array(target.candidate) / np.array(target.baseline))))
    assert target.ratio == pytest.approx(expected)
    assert "request-paired" not in summary.decision.rule


def test_independent_draws_per_arm_still_recover_the_true_effect(tmp_path: Path) -> None:
    # The generator draws each arm's latencies independently per request; the paired median still finds the
    # candidate's true 20 % TTFT and ITL gain, and the CI over repeats covers it.
    run = write_run_dir(
        tmp_path,
        Scenario(repeats=5, requests=1500, ttft_factor=0.8, itl_factor=0.8, config=json.loads(json.dumps(CONFIG))),
    )
    by_metric = {c.metric: c for c in analyse_run_dir(run.root).summary.comparisons}
    for metric in ("ttft_p50", "tpot_p50"):
        assert by_metric[metric].ci_low < 0.8 < by_metric[metric].ci_high, metric
