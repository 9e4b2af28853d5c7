"""Every report output is written, self-contained and consistent with the decision."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from harness.analysis.model import Summary
from harness.experiment.capacity import Probe, ProbeRun, SearchBounds, find_capacity, judge_probe
from harness.records.metric_registry import BY_NAME
from harness.records.run_dir import RunDir
from harness.report import figures
from harness.report.build import build_report
from tests.support.synthetic_results import Scenario, write_run_dir

CONFIG = {
    "decision": {
        "target": {"metric": "tpot_p50", "margin": 0.05},
        "gate": [
            {"metric": "slo_attainment", "margin": 0.01},
            {"metric": "ttft_p50", "margin": 0.5},
            {"metric": "e2e_p50", "margin": 0.05},
        ],
        "exploratory": ["itl_p99", "throughput"],
    },
    "cost": {"monthly_requests": 5e8, "setup_cost": 2000.0},
}
OUTPUTS = ("index_html", "summary_json", "decision_json", "summary_md", "junit_xml")


def write_complete_run(root: Path, itl_factor: float, simulated: bool = True) -> RunDir:
    """A generated run with saved output text, quality results and a capacity file."""
    run = write_run_dir(
        root,
        Scenario(
            itl_factor=itl_factor,
            repeats=3,
            requests=800,
            with_text=True,
            simulated=simulated,
            config=json.loads(json.dumps(CONFIG)),
        ),
    )
    tasks = [
        {
            "task_id": f"arith-{i}",
            "kind": "numeric",
            "baseline": {"passed": True, "output": "42"},
            "candidate": {"passed": True, "output": "42"},
            "identical": True,
            "first_divergent_token": None,
        }
        for i in range(3)
    ]
    run.quality_json.write_text(json.dumps({"tasks": tasks}))
    (run.root / "capacity.json").write_text(
        json.dumps(
            {
                "baseline": {"max_time_compression": 1.4, "cost_per_success_at_capacity": 3.1e-5},
                "candidate": {"max_time_compression": 1.8, "cost_per_success_at_capacity": 2.4e-5},
            }
        )
    )
    return run


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    run = write_complete_run(tmp_path_factory.mktemp("kept"), itl_factor=0.8)
    build_report(run.root)
    return run


def test_every_output_is_written(kept: RunDir) -> None:
    for name in OUTPUTS:
        path = getattr(kept, name)
        assert path.stat().st_size > 0, name
        assert path.stat().st_mode & 0o044, f"{name} is not readable by others"


def test_summary_and_decision_json_agree(kept: RunDir) -> None:
    summary = Summary.model_validate_json(kept.summary_json.read_text())
    decision = json.loads(kept.decision_json.read_text())
    assert summary.decision.outcome.value == decision["outcome"] == "KEEP"
    assert decision["exit_code"] == 0
    assert summary.capacity["candidate"].max_time_compression == 1.8
    assert summary.quality.identical_fraction == 1.0
    assert summary.cost.break_even_months is not None
    stored = json.loads(kept.summary_json.read_text())
    assert stored["comparisons"][0]["estimator"] == "request-paired median log-ratio"  # tpot_p50
    assert stored["planning"]["label"] == "planning, not evidence"
    assert stored["stability"]["load_class"] == "below capacity" and stored["stability"]["banner"] is None


def test_html_is_self_contained_and_complete(kept: RunDir) -> None:
    html = kept.index_html.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), "the report must not load anything remotely"
    assert html.count('<img class="figure"') == 5 and html.count('src="data:image/png;base64,') == 5
    for section in (
        "verdict",
        "metrics",
        "ecdf",
        "attainment",
        "fidelity",
        "repeats",
        "failures",
        "cost",
        "quality",
        "review",
        "environment",
    ):
        assert f'id="{section}"' in html, section
    assert "simulated engine" in html
    assert "KEEP" in html and "Rule:" in html
    assert "1.8" in html  # capacity shown
    assert 'id="stability"' in html and 'id="planning"' in html and "per-run quantile ratio" in html
    assert "bootstrap" not in html
    assert "answer " in html  # saved output text of reviewed requests
    assert f"<b>tpot</b> (Time per output token, s): {BY_NAME['tpot'].formula}" in html  # definitions of the rows


def test_real_engine_runs_are_not_labelled_simulated(tmp_path: Path) -> None:
    run = write_complete_run(tmp_path, itl_factor=1.0, simulated=False)
    build_report(run.root)
    assert "simulated engine" not in run.index_html.read_text()
    assert "simulated engine" not in run.summary_md.read_text()


def test_summary_markdown_fits_a_pr_comment(kept: RunDir) -> None:
    text = kept.summary_md.read_text()
    assert len(text) < 65_536  # GitHub's comment limit
    assert text.startswith("### ✅ replaybench: **KEEP**")
    assert "| tpot_p50 | target |" in text and "IMPROVEMENT" in text
    assert "Estimators: request-paired median log-ratio: tpot_p50" in text
    assert "\nPlanning (not evidence), at this run's noise" in text


def test_junit_has_one_case_per_decision_metric(tmp_path: Path) -> None:
    run = write_complete_run(tmp_path, itl_factor=1.3)
    decision = build_report(run.root)
    assert decision.outcome.value == "REJECT"
    suite = ET.parse(run.junit_xml).getroot().find("testsuite")
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert list(cases) == ["tpot_p50", "slo_attainment", "ttft_p50", "e2e_p50"]
    assert cases["tpot_p50"].find("failure") is not None
    assert int(suite.get("failures")) == sum(case.find("failure") is not None for case in cases.values()) >= 1


def test_report_command_rewrites_outputs_without_servers(kept: RunDir) -> None:
    for name in OUTPUTS:
        getattr(kept, name).unlink()
    result = subprocess.run(
        [str(Path(sys.executable).with_name("replaybench")), "report", str(kept.root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "KEEP" in result.stderr
    assert all(getattr(kept, name).exists() for name in OUTPUTS)
    # its result files predate receive-lag measurement: shown as unknown, said so, and not gated
    html = kept.index_html.read_text()
    assert "receive lag p99 (ms)" in html and "receive lag not measured in 6 of 6 result file(s)" in html
    runs = json.loads(kept.summary_json.read_text())["runs"]
    assert all(r["valid"] and r["receive_lag_p99_ms"] is None for r in runs)


def test_report_without_experiment_config_still_renders(tmp_path: Path) -> None:
    run = write_complete_run(tmp_path, itl_factor=0.8)
    run.experiment_toml.unlink()
    assert build_report(run.root).outcome.value == "INVALID"
    assert "no experiment.toml" in run.index_html.read_text()


def test_aa_runs_are_labelled(tmp_path: Path) -> None:
    run = write_run_dir(
        tmp_path, Scenario(repeats=3, requests=300, config=json.loads(json.dumps(CONFIG)) | {"mode": "A/A"})
    )
    build_report(run.root)
    assert "A/A run" in run.index_html.read_text()
    assert "**A/A run**" in run.summary_md.read_text()


def test_report_builds_when_nothing_got_slower(tmp_path: Path) -> None:
    run = write_run_dir(
        tmp_path,
        Scenario(
            repeats=3,
            requests=300,
            ttft_factor=0.3,
            itl_factor=0.3,
            with_text=True,
            config=json.loads(json.dumps(CONFIG)),
        ),
    )
    assert build_report(run.root).outcome.value == "KEEP"
    assert "No request was slower" in run.index_html.read_text()


def _searched(knee: float) -> dict:
    """capacity.json's entry of a real search (`find_capacity`) on a curve that holds the SLO up to `knee`x."""

    def probe(scale: float) -> Probe:
        attained = 1.0 if 1 / scale <= knee else 0.5
        return judge_probe(scale, tuple(ProbeRun(r, True, attained - 0.01 * r, 1e-5) for r in range(2)), 0.9)

    return find_capacity(probe, SearchBounds(min_scale=0.1, max_scale=1.0, tolerance=0.05)).to_json(0.9)


def test_capacity_probes_are_drawn_as_attainment_against_load(tmp_path: Path) -> None:
    run = write_complete_run(tmp_path, itl_factor=0.8)
    (run.root / "capacity.json").write_text(json.dumps({"baseline": _searched(3.0), "candidate": _searched(4.5)}))
    build_report(run.root)
    html = run.index_html.read_text()
    assert 'alt="SLO attainment against offered load, per arm (capacity probes)"' in html
    assert html.count('src="data:image/png;base64,') == 6  # the five figures of every report and this one
    entries = Summary.model_validate_json(run.summary_json.read_text()).capacity
    assert len(figures._probe_points(entries["candidate"])[1]) == len(entries["candidate"].model_extra["probes"])
    assert figures.capacity_curves({}, 0.9) is None  # no capacity.json, or one from before probes were kept
