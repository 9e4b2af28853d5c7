"""End-to-end analysis of generated run directories whose true effect is known."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import tomli_w

from harness.analysis.analyse import analyse_run_dir
from harness.analysis.decision import confidence_level
from harness.analysis.inputs import UnusableRunDir
from harness.analysis.look_levels import look_levels
from harness.analysis.model import Estimator, Outcome
from harness.records.result_io import read_results, write_results
from harness.records.run_dir import RunDir
from harness.records.worker_load import WorkerLoad, loads_to_meta
from tests.support.synthetic_results import Scenario, write_run_dir

CONFIG = {
    "decision": {
        "target": {"metric": "tpot_p50", "margin": 0.05},
        "gate": [{"metric": "slo_attainment", "margin": 0.01}, {"metric": "e2e_p50", "margin": 0.05}],
        "exploratory": ["ttft_p99", "itl_p99", "throughput"],
    },
    "cost": {"gpu_hour_price": 4.0, "monthly_requests": 1e8, "setup_cost": 500.0},
}


def make_run(root: Path, **changes: object) -> RunDir:
    scenario = Scenario(config=json.loads(json.dumps(CONFIG)), **changes)
    return write_run_dir(root, scenario)


@pytest.fixture(scope="module")
def improved(tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    return make_run(tmp_path_factory.mktemp("improved"), itl_factor=0.8, seed=1)


def comparison(analysis, metric: str):
    return next(c for c in analysis.summary.comparisons if c.metric == metric)


def test_twenty_percent_improvement_is_called_improvement_and_kept(improved: RunDir) -> None:
    analysis = analyse_run_dir(improved.root)
    target = comparison(analysis, "tpot_p50")
    assert target.verdict == "IMPROVEMENT"
    assert target.ratio == pytest.approx(0.8, abs=0.02)
    assert target.ci_low < 0.8 < target.ci_high or abs(target.ratio - 0.8) < 0.01
    assert target.estimator is Estimator.REQUEST_PAIRED
    decision = analysis.summary.decision
    assert decision.outcome is Outcome.KEEP, decision.reason
    assert decision.repeats_used == [0, 1, 2, 3, 4] and decision.excluded == []
    assert "tpot_p50" in decision.reason


def test_exploratory_metrics_are_labelled_and_corrected(improved: RunDir) -> None:
    analysis = analyse_run_dir(improved.root)
    exploratory = [c for c in analysis.summary.comparisons if c.role == "exploratory"]
    assert [c.metric for c in exploratory] == ["ttft_p99", "itl_p99", "throughput"]
    assert all(c.verdict is None and c.q_value is not None and c.q_value >= c.p_value for c in exploratory)
    assert comparison(analysis, "itl_p99").q_value < 0.01  # ITL really improved by 20 %


def test_one_percent_change_with_five_percent_margin_is_equivalent(tmp_path: Path) -> None:
    analysis = analyse_run_dir(make_run(tmp_path, itl_factor=0.99, seed=2).root)
    target = comparison(analysis, "tpot_p50")
    assert target.verdict == "EQUIVALENT"
    assert target.ratio == pytest.approx(0.99, abs=0.02)
    assert analysis.summary.decision.outcome is Outcome.INCONCLUSIVE  # equivalent is not an improvement
    reason = analysis.summary.decision.reason
    assert "not shown better" in reason
    # the reason plans the next run for the rule applied: KEEP's chance if the target truly improves 10 %
    planning = analysis.summary.planning
    assert planning.keep_power is not None and planning.repeats_needed is not None
    assert "planning, not evidence" in reason and f"KEPT with probability {planning.keep_power:.0%}" in reason
    assert f"about {planning.repeats_needed} repeats for 80%" in reason


def test_twenty_five_percent_regression_is_rejected(tmp_path: Path) -> None:
    analysis = analyse_run_dir(make_run(tmp_path, itl_factor=1.25, seed=3).root)
    assert comparison(analysis, "tpot_p50").verdict == "REGRESSION"
    assert comparison(analysis, "tpot_p50").regression_flag
    assert analysis.summary.decision.outcome is Outcome.REJECT
    assert "worse than its 5% margin" in analysis.summary.decision.reason


def _spoil_send_timing(path: Path, extra_lag_s: float) -> None:
    table, meta = read_results(path)
    lag = pc.add(table.column("lag_s"), extra_lag_s)
    table = table.set_column(table.schema.get_field_index("lag_s"), "lag_s", lag)
    write_results(path, table, meta)


def test_invalid_and_missing_runs_are_excluded_and_named(tmp_path: Path) -> None:
    run = make_run(tmp_path, itl_factor=0.8, repeats=7, seed=4)
    _spoil_send_timing(run.result("candidate", 2), 0.01)
    run.result("baseline", 4).unlink()
    attempts = json.loads(run.attempts_json.read_text())
    for attempt in attempts:
        if attempt["arm"] == "baseline" and attempt["repeat"] == 4:
            attempt.update(status="crashed", reason="server exited with code 137")
        if attempt["arm"] == "candidate" and attempt["repeat"] == 5:  # last try kept as the result, but invalid
            attempt.update(status="invalid", reason="p99 lag 9 ms", final=True)
    run.attempts_json.write_text(json.dumps(attempts))

    decision = analyse_run_dir(run.root).summary.decision
    assert decision.repeats_used == [0, 1, 3, 6]
    excluded = {e.repeat: " ".join(e.reasons) for e in decision.excluded}
    assert "p99 send lag" in excluded[2] and excluded[2].startswith("candidate")
    assert "crashed" in excluded[4] and "137" in excluded[4]
    assert excluded[5] == "candidate: invalid (p99 lag 9 ms)"
    assert decision.outcome is Outcome.KEEP


def _set_worker_loads(path: Path, p99_s: float) -> None:
    table, meta = read_results(path)
    write_results(path, table, meta | loads_to_meta([WorkerLoad(0, 500, p99_s / 3, p99_s, p99_s * 2, 0.6)]))


def test_a_client_bound_run_is_rejudged_from_its_file_and_excluded(tmp_path: Path) -> None:
    run = make_run(tmp_path, itl_factor=0.8, repeats=4, seed=4)
    for arm in ("baseline", "candidate"):
        for repeat in range(4):
            _set_worker_loads(run.result(arm, repeat), 0.001)
    _set_worker_loads(run.result("baseline", 1), 0.02)  # over the default 5 ms receive-lag budget
    summary = analyse_run_dir(run.root).summary
    assert summary.decision.repeats_used == [0, 2, 3]
    (excluded,) = summary.decision.excluded
    assert (
        excluded.repeat == 1
        and "baseline: invalid replay (client-bound: p99 receive lag 20.00 ms" in excluded.reasons[0]
    )
    row = next(r for r in summary.runs if (r.arm, r.repeat) == ("baseline", 1))
    assert (row.valid, row.receive_lag_p99_ms, row.client_cpu_share) == (False, pytest.approx(20.0), 0.6)
    assert not any("receive lag not measured" in note for note in summary.notes)
    toml = run.experiment_toml.read_text().replace("[decision]", "[decision]\nreceive_lag_budget_s = 0.05", 1)
    run.experiment_toml.write_text(toml)
    assert analyse_run_dir(run.root).summary.decision.repeats_used == [0, 1, 2, 3]  # the config's budget judges


def test_results_without_receive_lag_are_analysed_and_not_gated(improved: RunDir) -> None:
    summary = analyse_run_dir(improved.root).summary  # synthetic files carry no worker loads, like older runs
    assert all(r.valid and r.receive_lag_p99_ms is None and r.client_cpu_share is None for r in summary.runs)
    assert any(f"receive lag not measured in {len(summary.runs)} of {len(summary.runs)}" in n for n in summary.notes)
    assert summary.decision.outcome is Outcome.KEEP


def test_too_few_valid_repeats_is_invalid(tmp_path: Path) -> None:
    run = make_run(tmp_path, itl_factor=0.8, repeats=3, seed=5)
    _spoil_send_timing(run.result("baseline", 0), 0.01)
    decision = analyse_run_dir(run.root).summary.decision
    assert decision.outcome is Outcome.INVALID
    assert "only 2 valid repeat pair(s), 3 needed" in decision.reason and "repeat 0" in decision.reason


def test_missing_experiment_config_gives_a_report_but_no_decision(tmp_path: Path) -> None:
    run = make_run(tmp_path, itl_factor=0.8, seed=6)
    run.experiment_toml.unlink()
    summary = analyse_run_dir(run.root).summary
    assert summary.decision.outcome is Outcome.INVALID
    assert any("no experiment.toml" in note for note in summary.notes)
    assert len(summary.comparisons) > 0  # still analysed with the default rule


def test_config_typo_names_the_key(tmp_path: Path) -> None:
    run = make_run(tmp_path, seed=7)
    run.experiment_toml.write_text("[slo]\nttft = 1.0\n")
    summary = analyse_run_dir(run.root).summary
    assert summary.decision.outcome is Outcome.INVALID
    assert "slo.ttft" in summary.decision.reason


def test_quality_limits_are_checked(tmp_path: Path) -> None:
    run = make_run(tmp_path, itl_factor=0.8, repeats=3, seed=8)
    tasks = [
        {
            "task_id": f"t{i}",
            "kind": "exact",
            "baseline": {"passed": True, "output": "4"},
            "candidate": {"passed": i != 0, "output": "5" if i == 0 else "4"},
            "identical": i != 0,
            "first_divergent_token": 0 if i == 0 else None,
        }
        for i in range(4)
    ]
    run.quality_json.write_text(json.dumps({"tasks": tasks}))
    summary = analyse_run_dir(run.root).summary
    assert summary.quality.baseline_pass_rate == 1.0 and summary.quality.candidate_pass_rate == 0.75
    assert summary.quality.identical_fraction == 0.75
    assert summary.decision.outcome is Outcome.REJECT
    assert "pass rate" in summary.decision.reason


def test_required_quality_missing_is_invalid(tmp_path: Path) -> None:
    config = json.loads(json.dumps(CONFIG)) | {"quality": {"required": True}}
    run = write_run_dir(tmp_path, Scenario(config=config, itl_factor=0.8, repeats=3, seed=9))
    decision = analyse_run_dir(run.root).summary.decision
    assert decision.outcome is Outcome.INVALID and "quality" in decision.reason


def test_cost_per_success_and_break_even(improved: RunDir) -> None:
    summary = analyse_run_dir(improved.root).summary
    row = summary.runs[0]
    expected = row.duration_s / 3600 * 4.0 / row.successes
    assert row.metrics["cost_per_success"] == pytest.approx(expected)
    assert summary.cost.baseline_cost_per_success is not None
    assert summary.cost.line.startswith(("break-even after", "break-even: never"))


def test_failures_count_as_slo_misses_and_by_class(tmp_path: Path) -> None:
    run = make_run(tmp_path, failure_rate=0.1, repeats=2, seed=10)
    summary = analyse_run_dir(run.root).summary
    row = summary.runs[0]
    assert row.failures == {"http_5xx": row.requests - row.successes}
    assert row.metrics["slo_attainment"] <= row.successes / row.requests


def test_capacity_json_is_read(improved: RunDir, tmp_path: Path) -> None:
    copy = RunDir(Path(shutil.copytree(improved.root, tmp_path / "copy")))
    (copy.root / "capacity.json").write_text(
        json.dumps(
            {
                "baseline": {"max_time_compression": 1.5, "cost_per_success_at_capacity": 2e-5},
                "candidate": {"max_time_compression": 1.9, "cost_per_success_at_capacity": 1.6e-5},
            }
        )
    )
    capacity = analyse_run_dir(copy.root).summary.capacity
    assert capacity["candidate"].max_time_compression == 1.9


def test_unusable_run_dirs_raise_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UnusableRunDir, match="no such run directory"):
        analyse_run_dir(tmp_path / "missing")
    with pytest.raises(UnusableRunDir, match="no result files"):
        analyse_run_dir(tmp_path)


def test_a_corrupt_result_file_excludes_its_repeat(tmp_path: Path) -> None:
    run = make_run(tmp_path, itl_factor=0.8, repeats=4, seed=11)
    run.result("candidate", 1).write_bytes(b"not parquet")
    decision = analyse_run_dir(run.root).summary.decision
    assert decision.repeats_used == [0, 2, 3]
    assert "unreadable" in decision.excluded[0].reasons[0]


def test_output_length_mismatches_are_counted(tmp_path: Path) -> None:
    run = make_run(tmp_path, repeats=2, seed=12)
    table, meta = read_results(run.result("candidate", 0))
    expected = pc.add(table.column("expected_output_tokens"), pa.scalar(1, pa.int32()))
    table = table.set_column(table.schema.get_field_index("expected_output_tokens"), "expected_output_tokens", expected)
    write_results(run.result("candidate", 0), table, meta)
    rows = {(r.arm, r.repeat): r for r in analyse_run_dir(run.root).summary.runs}
    assert rows[("candidate", 0)].output_mismatches == rows[("candidate", 0)].successes
    assert rows[("baseline", 0)].output_mismatches == 0


def test_a_candidate_failing_every_request_is_rejected(tmp_path: Path) -> None:
    run = make_run(tmp_path, repeats=3, seed=13)
    for repeat in range(3):
        table, meta = read_results(run.result("candidate", repeat))
        errors = pa.array(["connect"] * table.num_rows, pa.string())
        table = table.set_column(table.schema.get_field_index("error"), "error", errors)
        write_results(run.result("candidate", repeat), table, meta)
    summary = analyse_run_dir(run.root).summary
    assert next(c for c in summary.comparisons if c.metric == "slo_attainment").verdict == "REGRESSION"
    assert summary.decision.outcome is Outcome.REJECT
    assert summary.runs[1].failures == {"connect": summary.runs[1].requests}


def test_review_lists_only_requests_that_got_slower(improved: RunDir, tmp_path: Path) -> None:
    summary = analyse_run_dir(improved.root).summary
    assert summary.review_requests and all(r.ratio > 1 for r in summary.review_requests)
    faster = analyse_run_dir(make_run(tmp_path, ttft_factor=0.3, itl_factor=0.3, repeats=2, seed=14).root).summary
    assert faster.review_requests == [] and faster.review_windows == []


def test_sequential_looks_test_each_look_at_its_share_of_alpha(tmp_path: Path) -> None:
    config = json.loads(json.dumps(CONFIG))
    config["decision"]["looks"] = [3, 5]
    first, last = look_levels(0.05, (3, 5), "obrien-fleming")
    assert first < 0.025 < last < 0.05  # O'Brien-Fleming: little at the first look, nearly alpha at the last
    early = write_run_dir(tmp_path / "early", Scenario(config=config, itl_factor=0.8, repeats=3, seed=21))
    summary = analyse_run_dir(early.root).summary
    assert summary.alpha == pytest.approx(first) and summary.decision.outcome is Outcome.KEEP
    assert (
        f"sequential: looks at 3, 5 repeats, at levels {first:.3g}, {last:.3g} (O'Brien-Fleming spending of alpha "
        "0.05)" in summary.decision.rule
    )
    assert f"{confidence_level(first)} paired t-interval" in summary.decision.rule
    assert f"this one at {first:.3g}: 3 repeat(s) ran, stopped early" in " ".join(summary.notes)
    assert "tends to overstate it" in " ".join(summary.notes)  # the early stop's bias, said beside the verdict
    config["decision"]["look_spending"] = "bonferroni"
    (early.root / "experiment.toml").write_text(tomli_w.dumps({"name": "synthetic", **config}))
    bonferroni = analyse_run_dir(early.root).summary
    assert bonferroni.alpha == pytest.approx(0.025)
    assert "at levels 0.025, 0.025 (alpha / 2)" in bonferroni.decision.rule
    target = comparison(analyse_run_dir(early.root), "tpot_p50")
    config["decision"]["looks"] = []  # the same repeats at one look: a narrower interval
    (early.root / "experiment.toml").write_text(tomli_w.dumps({"name": "synthetic", **config}))
    single = comparison(analyse_run_dir(early.root), "tpot_p50")
    assert single.ci_high - single.ci_low < target.ci_high - target.ci_low
    config["decision"]["looks"] = [3, 5]
    between = write_run_dir(tmp_path / "between", Scenario(config=config, itl_factor=0.8, repeats=4, seed=22))
    decision = analyse_run_dir(between.root).summary.decision
    assert decision.outcome is Outcome.INVALID and decision.reason.startswith(
        "analysed after 4 repeat(s), between the pre-registered looks (3, 5): a verdict here would not keep its "
        "error within alpha; resume the run to the next look."
    )
