"""`replaybench gate` exit codes and one-line output, through the real console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.synthetic_results import Scenario, write_run_dir

REPLAYBENCH = Path(sys.executable).with_name("replaybench")
CONFIG = {
    "decision": {
        "target": {"metric": "tpot_p50", "margin": 0.05},
        "gate": [{"metric": "slo_attainment", "margin": 0.01}],
        "exploratory": [],
    }
}


def gate(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPLAYBENCH), "gate", str(run_dir)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("itl_factor", "repeats", "code", "word"),
    [
        (0.8, 3, 0, "KEEP"),
        (1.25, 3, 1, "REJECT"),
        (1.0, 3, 2, "INCONCLUSIVE"),
        (0.8, 2, 3, "INVALID"),  # fewer valid repeat pairs than min_repeats = 3
    ],
)
def test_gate_exit_code_follows_the_decision(
    tmp_path: Path, itl_factor: float, repeats: int, code: int, word: str
) -> None:
    scenario = Scenario(itl_factor=itl_factor, repeats=repeats, requests=600, config=json.loads(json.dumps(CONFIG)))
    run = write_run_dir(tmp_path, scenario)
    result = gate(run.root)
    assert result.returncode == code, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{word}: ")
    assert "Traceback" not in result.stderr


def test_gate_on_a_missing_or_empty_directory_is_invalid(tmp_path: Path) -> None:
    for target in (tmp_path / "nope", tmp_path):
        result = gate(target)
        assert result.returncode == 3
        assert result.stdout.startswith("INVALID: ") and str(target) in result.stdout
        assert "Traceback" not in result.stderr


def test_report_on_a_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(REPLAYBENCH), "report", str(tmp_path / "nope")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
