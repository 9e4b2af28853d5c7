"""`replaybench run` with pre-registered looks (`[decision] looks`): it analyses at each look and stops once the verdict
is KEEP or REJECT, on the embedded engine; a resume after that stop runs nothing more."""

from __future__ import annotations

import json

from harness.analysis.decision import confidence_level
from harness.analysis.look_levels import look_levels
from harness.analysis.model import Outcome, Summary
from tests.experiment.support import config_dict, sim_command, tiny_trace, write_config
from tests.experiment.test_cli import only_run_dir, replaybench


def test_a_run_stops_at_the_first_look_that_decides(tmp_path) -> None:
    trace = tiny_trace(tmp_path / "trace.parquet", requests=6, output_tokens=24)
    document = config_dict(trace, repeats=5, policy_change=["--gpu"])
    document["arms"]["baseline"]["command"] = sim_command("baseline")  # type: ignore[index]
    document["arms"]["candidate"]["command"] = sim_command("baseline", "--gpu", "a100")  # type: ignore[index]
    # the first look at 3 repeats: with 2 (one degree of freedom) its O'Brien-Fleming level needs t > 113
    document["decision"] |= {"looks": [3, 5]}  # type: ignore[operator]
    config = write_config(tmp_path / "exp.toml", document)
    result = replaybench("run", "--config", str(config), "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    run = only_run_dir(tmp_path / "out")
    attempts = json.loads((run / "attempts.json").read_text())
    assert sorted({a["repeat"] for a in attempts}) == [0, 1, 2]  # the A100 decodes far slower: REJECT at the first look
    summary = Summary.model_validate_json((run / "summary.json").read_text())
    assert summary.decision.outcome is Outcome.REJECT
    assert summary.alpha == look_levels(0.05, (3, 5), "obrien-fleming")[0]  # the first look's share of alpha
    level = confidence_level(summary.alpha)
    assert f"{level} CI over repeats" in result.stdout and "95 % CI" not in result.stdout  # the closing table's level
    assert any("3 repeat(s) ran, stopped early: this look decided" in note for note in summary.notes)
    assert "look at 3 repeats: REJECT, the remaining repeats are not run" in result.stdout + result.stderr
    resumed = replaybench("run", "--config", str(config), "--output-dir", str(tmp_path / "out"), "--resume", str(run))
    assert resumed.returncode == 0, resumed.stderr
    assert sorted({a["repeat"] for a in json.loads((run / "attempts.json").read_text())}) == [0, 1, 2]


def test_the_last_look_must_be_the_runs_repeats(tmp_path) -> None:
    document = config_dict(tiny_trace(tmp_path / "trace.parquet"), repeats=5)
    document["decision"] |= {"looks": [2, 4]}  # type: ignore[operator]
    result = replaybench("check", str(write_config(tmp_path / "exp.toml", document)))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "[decision] looks end at 4 repeats but repeats = 5; make the last look the run's repeats" in result.stderr


def test_check_shows_each_looks_level_before_the_run(tmp_path) -> None:
    document = config_dict(tiny_trace(tmp_path / "trace.parquet"), repeats=5)
    document["decision"] |= {"looks": [3, 5]}  # type: ignore[operator]
    result = replaybench("check", str(write_config(tmp_path / "exp.toml", document)))
    first, last = look_levels(0.05, (3, 5), "obrien-fleming")
    expected = f"sequential looks at 3, 5 repeats, at levels {first:.3g}, {last:.3g} (O'Brien-Fleming spending"
    assert expected in " ".join(result.stdout.split()), result.stdout  # rich may wrap the line
