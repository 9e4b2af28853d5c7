"""The metric registry is the one source of names, units and directions, and the analysis computes exactly it."""

from __future__ import annotations

import tomllib

import pytest

from harness.analysis.analyse import analyse_run_dir
from harness.analysis.log_histogram import BINS
from harness.errors import UserError
from harness.records.decision_config import analysis_config_from_mapping
from harness.records.metric_registry import (
    BY_NAME,
    LATENCY_METRICS,
    METRIC_DIRECTIONS,
    METRICS,
    STATISTICS,
    metric_of,
)
from tests.support.synthetic_results import Scenario, write_run_dir


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory):
    config = {"decision": {"exploratory": ["tpot_mean", "output_throughput"]}}
    return analyse_run_dir(
        write_run_dir(tmp_path_factory.mktemp("run"), Scenario(repeats=3, requests=300, config=config)).root
    )


def test_every_run_holds_exactly_the_registered_computed_metrics(analysed) -> None:
    for run in analysed.summary.runs:
        assert set(run.metrics) == set(METRIC_DIRECTIONS), run.file
        assert all(run.metrics[f"{m}_{s}"] is not None for m in LATENCY_METRICS for s in STATISTICS)
    assert analysed.plots.histograms["baseline"].shape == (len(LATENCY_METRICS), BINS)


def test_means_and_output_throughput_can_be_compared(analysed) -> None:
    compared = {c.metric: c for c in analysed.summary.comparisons}
    assert compared["tpot_mean"].better == "lower" and compared["tpot_mean"].ratio is not None
    assert compared["output_throughput"].better == "higher" and compared["output_throughput"].ratio is not None


def test_directions_come_from_the_registry() -> None:
    assert METRIC_DIRECTIONS["ttft_p99"] == BY_NAME["ttft"].better == "lower"
    assert METRIC_DIRECTIONS["goodput"] == "higher" and METRIC_DIRECTIONS["cost_per_success"] == "lower"
    assert metric_of("e2e_p90") is BY_NAME["e2e"] and metric_of("slo_attainment").unit == "fraction"
    with pytest.raises(KeyError, match="unknown metric 'ttft'"):
        metric_of("ttft")  # a latency kind needs its statistic


def test_icl_is_computed_and_decidable_and_a_typo_is_not() -> None:
    assert "icl" in LATENCY_METRICS and METRIC_DIRECTIONS["icl_p50"] == "lower"
    document = tomllib.loads('[decision]\ntarget = { metric = "icl_p55" }\n')
    with pytest.raises(UserError, match="unknown metric 'icl_p55'"):
        analysis_config_from_mapping(document, "experiment.toml")


def test_every_definition_is_complete_and_names_are_unique() -> None:
    assert len({m.name for m in METRICS}) == len(METRICS)
    for m in METRICS:
        assert all((m.title, m.formula, m.timestamps, m.failures)), m.name
        if m.source == "client":  # a server's mean step time is in seconds but one number per run
            assert m.latency == (m.unit == "s"), m.name
    assert {m.vllm_name for m in METRICS if m.vllm_name} >= {"ttft", "tpot", "itl", "e2el", "request_throughput"}


def test_server_counted_metrics_are_documented_but_never_decision_metrics() -> None:
    server = {m.name for m in METRICS if m.source == "server"}
    assert {"acceptance_length", "engine_steps_per_s", "emitted_throughput", "processed_throughput"} <= server
    assert not server & set(METRIC_DIRECTIONS)
    document = tomllib.loads('[decision]\nexploratory = ["acceptance_length"]\n')
    with pytest.raises(UserError, match="unknown metric"):
        analysis_config_from_mapping(document, "experiment.toml")
