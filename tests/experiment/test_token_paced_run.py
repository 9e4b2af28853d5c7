"""`replaybench run` against a server that streams several tokens per chunk, some with empty text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.experiment.support import config_dict, tiny_trace, write_config
from tests.experiment.test_cli import only_run_dir, replaybench
from tests.support.openai_server import REPO_ROOT

PACE_S = 0.02


@pytest.mark.timing
def test_run_summary_reports_the_servers_per_token_pace(tmp_path: Path) -> None:
    command = ["{python}", "-m", "tests.support.openai_server", "--port", "{port}", "--token-delay", str(PACE_S)]
    command += ["--chunk-tokens", "1,3,2,4", "--empty-every", "3"]
    arm = {"command": command, "cwd": str(REPO_ROOT), "startup_timeout_s": 60, "stop_grace_s": 5}
    document = config_dict(tiny_trace(tmp_path / "trace.parquet", requests=6, output_tokens=25))
    document["arms"] = {"baseline": arm, "candidate": "baseline"}
    document["policy_change"] = []
    result = replaybench(
        "run", "--config", str(write_config(tmp_path / "aa.toml", document)), "--output-dir", str(tmp_path / "out")
    )
    assert result.returncode in (0, 2), result.stderr  # an A/A decides nothing, but it must run
    summary = json.loads((only_run_dir(tmp_path / "out") / "summary.json").read_text())
    for run in summary["runs"]:
        assert run["token_count_sources"] == {"continuous_usage": 6} and run["output_mismatches"] == 0
        assert run["metrics"]["tpot_p50"] == pytest.approx(PACE_S, rel=0.05)
        assert run["metrics"]["itl_p50"] == pytest.approx(PACE_S, rel=0.05)
