"""summary.json carries each arm's numbers under `vllm bench serve` names, equal to values computed from the results."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.analysis.analyse import analyse_run_dir
from harness.analysis.inputs import ARMS
from harness.records.result_io import read_results
from harness.records.run_dir import RunDir
from harness.report.build import build_report
from tests.support.synthetic_results import Scenario, write_run_dir

REPEATS = 3
CONFIG: dict = {"decision": {}}


def _from_results(path: Path) -> dict[str, float]:
    """The vLLM-named values of one result file, computed here straight from its rows."""
    table, _ = read_results(path)
    rows = table.to_pylist()
    ok = [r for r in rows if r["error"] is None and 200 <= r["status"] < 300 and r["e2e_s"] is not None]
    ttft = np.array([r["ttft_s"] for r in ok])
    e2e = np.array([r["e2e_s"] for r in ok])
    tpot = np.array([(r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) for r in ok if r["output_tokens"] > 1])
    gaps = np.concatenate([np.diff(np.asarray(r["token_times"], np.float32)) for r in ok])
    start = min(r["intended_s"] for r in rows)
    end = max(r["sent_s"] + r["e2e_s"] for r in ok)
    output_tokens = sum(r["output_tokens"] for r in ok)
    return {
        "mean_ttft_ms": ttft.mean() * 1e3,
        "median_ttft_ms": np.median(ttft) * 1e3,
        "p99_ttft_ms": np.quantile(ttft, 0.99) * 1e3,
        "mean_tpot_ms": tpot.mean() * 1e3,
        "p90_tpot_ms": np.quantile(tpot, 0.9) * 1e3,
        "p99_tpot_ms": np.quantile(tpot, 0.99) * 1e3,
        "mean_itl_ms": gaps.mean(dtype=np.float64) * 1e3,
        "median_itl_ms": np.median(gaps) * 1e3,
        "p99_itl_ms": np.quantile(gaps, 0.99) * 1e3,
        "mean_e2el_ms": e2e.mean() * 1e3,
        "p99_e2el_ms": np.quantile(e2e, 0.99) * 1e3,
        "completed": len(ok),
        "failed": len(rows) - len(ok),
        "total_input_tokens": sum(r["prompt_tokens"] for r in ok),
        "total_output_tokens": output_tokens,
        "request_throughput": len(ok) / (end - start),
        "output_throughput": output_tokens / (end - start),
        "duration": end - start,
    }


def _expected(run: RunDir, arm: str, repeats: range) -> dict[str, float]:
    per_run = [_from_results(run.result(arm, k)) for k in repeats]
    return {key: float(np.mean([values[key] for values in per_run])) for key in per_run[0]}


def _assert_matches(aliases: dict[str, float | None], expected: dict[str, float]) -> None:
    for key, value in expected.items():
        # inter-token gap quantiles come from the log histogram (bins 0.25 % wide); everything else is exact
        tolerance = 3e-3 if key.endswith("itl_ms") and not key.startswith("mean") else 1e-6
        assert aliases[key] == pytest.approx(value, rel=tolerance), key


@pytest.fixture(scope="module")
def reported(tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    scenario = Scenario(repeats=REPEATS, requests=400, itl_factor=0.9, failure_rate=0.02, config=CONFIG)
    run = write_run_dir(tmp_path_factory.mktemp("aliases"), scenario)
    build_report(run.root)
    return run


def test_summary_json_holds_vllm_names_per_arm_equal_to_our_metrics(reported: RunDir) -> None:
    summary = json.loads(reported.summary_json.read_text())
    assert set(summary["vllm_aliases"]) == set(ARMS)
    for arm in ARMS:
        _assert_matches(summary["vllm_aliases"][arm], _expected(reported, arm, range(REPEATS)))
        runs = [r for r in summary["runs"] if r["arm"] == arm]
        goodput = np.mean([r["metrics"]["goodput"] for r in runs])
        p50_ttft = np.mean([r["metrics"]["ttft_p50"] for r in runs]) * 1e3
        assert summary["vllm_aliases"][arm]["request_goodput"] == pytest.approx(goodput, rel=1e-9)
        assert summary["vllm_aliases"][arm]["p50_ttft_ms"] == pytest.approx(p50_ttft, rel=1e-9)
    assert summary["vllm_aliases"]["candidate"]["mean_itl_ms"] < summary["vllm_aliases"]["baseline"]["mean_itl_ms"]


def test_without_a_valid_repeat_pair_the_aliases_use_every_run_of_the_arm(tmp_path: Path) -> None:
    config = {"decision": {"lag_budget_s": 1e-9}}  # every replay is too late
    run = write_run_dir(tmp_path, Scenario(repeats=2, requests=200, config=config))
    summary = analyse_run_dir(run.root).summary
    assert summary.decision.outcome.value == "INVALID" and summary.decision.repeats_used == []
    _assert_matches(summary.vllm_aliases["baseline"], _expected(run, "baseline", range(2)))
