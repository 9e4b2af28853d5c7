"""The server cross-check in summary.json and the report: client means beside the server's, and the TPOT flag."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest
import tomli_w

from harness.analysis.analyse import analyse_run_dir
from harness.analysis.model import Summary
from harness.records.run_dir import RunDir
from harness.report.build import build_report
from tests.support.synthetic_results import Scenario, write_run_dir
from tests.support.vllm_metrics import Engine, exposition

NOTHING_YET = Engine(0.0, 0, 0.0, 0, 0.0, 0, 0.0, 0, 0, 0, 0, 0, 0, 0)
# client mean TPOT / server mean TPOT per run: r0 baseline 20 % above (client-side), r1 candidate 20 % below
RATIOS = {("baseline", 0): 1.2, ("candidate", 1): 1 / 1.2}


def write_snapshots(
    run: RunDir, arm: str, repeat: int, tpot_s: float, generated: int, requests: int, cache_hit_rate: float = 0.0
) -> None:
    """The /metrics of a server that stamped a mean TPOT of `tpot_s` over `requests` requests (of 500 prompt
    tokens each, `cache_hit_rate` of them found in its prefix cache)."""
    prompt = 500 * requests
    after = Engine(
        0.1 * requests, requests, tpot_s * 10 * requests, 10 * requests, tpot_s * requests, requests,
        1.0 * requests, requests, 0, generated, prompt, requests, 0, 1, prompt, round(cache_hit_rate * prompt),
    )  # fmt: skip
    run.metrics(arm, repeat, "before").parent.mkdir(parents=True, exist_ok=True)
    run.metrics(arm, repeat, "before").write_text(exposition(NOTHING_YET))
    run.metrics(arm, repeat, "after").write_text(exposition(after))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    run = write_run_dir(
        tmp_path_factory.mktemp("check"),
        Scenario(repeats=3, requests=300, config={"decision": {"min_repeats": 2}}),
    )
    for row in analyse_run_dir(run.root).summary.runs:
        client = row.server_check.client
        ratio = RATIOS.get((row.arm, row.repeat), 1.01)
        # baseline r0's client also counted half the tokens the server generated (chunks, not tokens)
        generated = int(client["generated_tokens"]) * (2 if (row.arm, row.repeat) == ("baseline", 0) else 1)
        write_snapshots(run, row.arm, row.repeat, client["tpot_mean_s"] / ratio, generated, int(client["requests"]))
    build_report(run.root)
    return run


def summary_of(run: RunDir) -> Summary:
    return Summary.model_validate_json(run.summary_json.read_text())


def test_runs_beyond_the_tolerance_are_flagged_with_the_slow_side(run: RunDir) -> None:
    rows = {(r.arm, r.repeat): r for r in summary_of(run).runs}
    client_slow = rows[("baseline", 0)].server_check
    assert client_slow.slow_side == "client" and client_slow.tpot_ratio == pytest.approx(1.2)
    assert "client-side" in client_slow.warning and "20.0% above" in client_slow.warning
    assert "counted" in client_slow.warning  # the token counts disagree too
    server_slow = rows[("candidate", 1)].server_check
    assert server_slow.slow_side == "server" and "server-side" in server_slow.warning
    assert "counted" not in server_slow.warning
    for key, row in rows.items():
        assert row.valid, "the flag warns; it does not invalidate"
        assert row.warnings == ([row.server_check.warning] if key in RATIOS else [])
        if key not in RATIOS:
            assert row.server_check.tpot_ratio == pytest.approx(1.01) and row.server_check.slow_side is None
    assert summary_of(run).decision.repeats_used == [0, 1, 2]


def test_server_values_sit_beside_the_clients(run: RunDir) -> None:
    summary = summary_of(run)
    row = next(r for r in summary.runs if (r.arm, r.repeat) == ("candidate", 0))
    check = row.server_check
    assert check.server["requests"] == check.client["requests"] == 300
    assert check.server["ttft_mean_s"] == pytest.approx(0.1) and check.server["e2e_mean_s"] == pytest.approx(1.0)
    assert check.server["preemptions"] == 1 and check.client["preemptions"] is None
    assert check.server["prompt_tokens"] == 500 * 300
    assert check.missing == [] and check.notes == []
    baseline = summary.server_check["baseline"]
    runs = [r.server_check.server["tpot_mean_s"] for r in summary.runs if r.arm == "baseline"]
    assert baseline.runs == 3 and baseline.flagged == 1
    assert baseline.server["tpot_mean_s"] == pytest.approx(sum(runs) / 3)


def test_report_and_pr_comment_show_the_check(run: RunDir) -> None:
    html = run.index_html.read_text()
    assert 'id="server-check"' in html and "mean TPOT (server: engine core)" in html
    assert "client-side: the client sees tokens later" in html
    comment = run.summary_md.read_text()
    assert "Server cross-check, mean TPOT client / server: baseline " in comment
    assert "⚠️ baseline r0: client mean TPOT" in comment and "⚠️ candidate r1: client mean TPOT" in comment


def test_tolerance_is_a_decision_setting(run: RunDir, tmp_path: Path) -> None:
    copy = RunDir(Path(shutil.copytree(run.root, tmp_path / "copy")))
    config = tomllib.loads(copy.experiment_toml.read_text())
    config["decision"]["server_tpot_tolerance"] = 0.25
    copy.experiment_toml.write_text(tomli_w.dumps(config))
    rows = analyse_run_dir(copy.root).summary.runs
    assert all(r.server_check.slow_side is None and r.warnings == [] for r in rows)


def test_a_run_without_snapshots_says_so(tmp_path: Path) -> None:
    bare = write_run_dir(tmp_path, Scenario(repeats=2, requests=50))
    row = analyse_run_dir(bare.root).summary.runs[0]
    assert row.server_check.server["tpot_mean_s"] is None and row.server_check.tpot_ratio is None
    assert row.server_check.notes == [
        "no /metrics snapshot baseline-r0.before.prom",
        "no /metrics snapshot baseline-r0.after.prom",
    ]
    assert row.server_check.client["tpot_mean_s"] > 0 and row.warnings == []


def test_arms_whose_prefix_caches_hit_differently_are_warned_of(tmp_path: Path) -> None:
    run = write_run_dir(tmp_path, Scenario(repeats=2, requests=100, config={"decision": {"min_repeats": 2}}))
    rates = {"baseline": 0.40, "candidate": 0.0}  # the candidate's server runs with prefix caching off
    for row in analyse_run_dir(run.root).summary.runs:
        client = row.server_check.client
        write_snapshots(
            run, row.arm, row.repeat, client["tpot_mean_s"], int(client["generated_tokens"]), 100, rates[row.arm]
        )
    build_report(run.root)
    check = summary_of(run).prefix_cache
    assert check.hit_rate == pytest.approx(rates) and check.matched is False and check.tolerance == 0.05
    assert "40.0 points apart" in check.line and "did not start from the same cache state" in check.line
    assert "⚠️ Prefix cache (server): baseline 40.0% · candidate 0.0% of queried prompt tokens" in (
        run.summary_md.read_text()
    )
    assert "prefix-cache hit rate (cached / queried prompt tokens)" in run.index_html.read_text()
    assert summary_of(run).decision.repeats_used == [0, 1]  # a warning, not a gate
    config = tomllib.loads(run.experiment_toml.read_text())
    config["decision"]["prefix_cache_tolerance"] = 0.5
    run.experiment_toml.write_text(tomli_w.dumps(config))
    assert analyse_run_dir(run.root).summary.prefix_cache.matched is True


def test_the_prefix_cache_line_is_left_out_when_no_server_counts(tmp_path: Path) -> None:
    bare = write_run_dir(tmp_path, Scenario(repeats=2, requests=50))
    check = analyse_run_dir(bare.root).summary.prefix_cache
    assert check.matched is None and check.line == ""
