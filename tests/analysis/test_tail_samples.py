"""A decision metric's per-run tail quantile from too few requests is said before a run (check) and after (report)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.analysis.analyse import analyse_run_dir
from harness.experiment.check import run_checks
from harness.experiment.config import load_config
from tests.experiment.support import config_dict, tiny_trace, write_config
from tests.support.synthetic_results import Scenario, write_run_dir


def _decision_findings(tmp_path: Path, requests: int, **decision: object) -> list[tuple[str, str]]:
    trace = tiny_trace(tmp_path / "trace.parquet", requests=requests)
    document = config_dict(trace)
    document["decision"] = document["decision"] | decision  # type: ignore[operator]
    config = load_config(write_config(tmp_path / "c.toml", document))
    return [(f.level, f.message) for f in run_checks(config) if f.topic == "decision" and f.level == "warn"]


def test_check_warns_when_the_default_ttft_p99_gate_rests_on_one_or_two_requests(tmp_path: Path) -> None:
    (level, message), *more = _decision_findings(tmp_path, 150)
    assert level == "warn" and not more
    assert message.startswith("ttft_p99 (gate) rests on the slowest 1.5 of 150 requests a run (the trace slice)")
    assert "needs 500 requests a run for 5 beyond it" in message and "gate on ttft_p90" in message


@pytest.mark.parametrize(
    ("requests", "decision"),
    [
        (500, {}),  # 5 beyond the p99: enough
        (150, {"gate": [{"metric": "ttft_p90", "margin": 0.15}]}),  # 15 beyond the p90
        (150, {"gate": [{"metric": "itl_p99", "margin": 0.15}], "exploratory": []}),  # gaps: thousands a run
    ],
)
def test_check_is_quiet_where_the_tail_has_requests_enough(tmp_path: Path, requests: int, decision: dict) -> None:
    assert _decision_findings(tmp_path, requests, **decision) == []


def test_a_target_tail_is_held_to_the_same_line(tmp_path: Path) -> None:
    found = _decision_findings(tmp_path, 40, target={"metric": "tpot_p90", "margin": 0.05}, gate=[])
    assert [m.split(":")[0] for _, m in found] == ["tpot_p90 (target) rests on the slowest 4.0 of 40 requests a run "
                                                   "(the trace slice)"]  # fmt: skip
    assert "gate on tpot_p50" in found[0][1]


def _report_notes(root: Path, requests: int) -> list[str]:
    config = {"decision": {"target": {"metric": "tpot_p50", "margin": 0.05},
                           "gate": [{"metric": "e2e_p99", "margin": 0.15}], "exploratory": []}}  # fmt: skip
    run = write_run_dir(root, Scenario(requests=requests, repeats=3, config=json.loads(json.dumps(config))))
    return [n for n in analyse_run_dir(run.root).summary.notes if "rests on the slowest" in n]


def test_the_report_counts_the_successful_requests_of_the_sparsest_run(tmp_path: Path) -> None:
    """200 requests a run, 0.2 % failing: at most 200 successes in the sparsest run, so 2 or fewer beyond the p99."""
    (note,) = _report_notes(tmp_path / "few", 200)
    beyond, successes = note.split("rests on the slowest ")[1].split(" successful")[0].split(" of ")
    assert note.startswith("e2e_p99 (gate)") and float(beyond) <= 2.0 and 190 <= int(successes) <= 200
    assert _report_notes(tmp_path / "many", 2_000) == []
