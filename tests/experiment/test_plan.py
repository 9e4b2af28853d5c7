"""`replaybench plan`: simulated A/A repeats at a share of the simulated baseline's capacity -> repeats needed."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.experiment.support import REPO, config_dict, sim_command, write_config
from tests.experiment.test_cli import replaybench


@pytest.fixture(scope="module")
def plan_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An A/A config of the embedded engine over 150 Azure conversation requests."""
    trace = REPO / "traces/azure-conv-2023.parquet"
    document = config_dict(trace) | {
        "trace": {"path": str(trace), "start_s": 600.0, "limit": 150},
        "arms": {"baseline": {"command": sim_command("baseline")}, "candidate": "baseline"},
        "slo": {"ttft_s": 2.0, "tpot_s": 0.05},
    }
    return write_config(tmp_path_factory.mktemp("plan") / "plan.toml", document)


NEEDED = re.compile(
    r"repeats needed: (\d+|more than 100) to KEEP a true 10% improvement with 80% power \(the target alone: (\d+)\)"
)

LOOKS_LINE = re.compile(
    r"  (looks at .*\)): the target's CI clears its margin by the last look in (\d+)% of simulated runs, which stop "
    r"after ([\d.]+) repeats on average"
)


def repeats_needed(plan_config: Path, load: str) -> tuple[float, int, str]:
    """(repeats with the gates, for the target alone, the whole output) at this load."""
    result = replaybench("plan", "-c", str(plan_config), "--load", load, "--pairs", "6")
    assert result.returncode == 0, result.stderr
    match = NEEDED.search(result.stdout)
    assert match, result.stdout
    with_gates = float("inf") if match.group(1).startswith("more") else int(match.group(1))
    return with_gates, int(match.group(2)), result.stdout


def test_plan_needs_more_repeats_near_capacity(plan_config: Path) -> None:
    light, light_target, text = repeats_needed(plan_config, "0.5")
    heavy, heavy_target, _ = repeats_needed(plan_config, "0.97")
    assert text.startswith("PLANNING (simulated A/A, not evidence)")
    assert "load: 50% of the simulated baseline's capacity" in text
    assert "step-time noise shared per repeat 2.5%, per run 0.8%, step AR(1) 7.0% (phi 0.9)" in text
    assert (
        "tpot_p50 " in text
        and "(target ±5%, request-paired median log-ratio)" in text
        and "(gate ±15%, per-run quantile ratio)" in text
    )
    assert 2 <= light_target < heavy_target and light_target <= light <= heavy


def test_plan_refuses_an_effect_at_the_margin_and_a_bad_load(plan_config: Path) -> None:
    result = replaybench("plan", "-c", str(plan_config), "--effect", "0.05")
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "error: --effect 0.05 must exceed the target's margin 0.05: KEEP needs the CI beyond the margin, so a true "
        "change at the margin is kept at most alpha/2 of the time"
    ]
    result = replaybench("plan", "-c", str(plan_config), "--load", "2")
    assert result.returncode == 2 and "--load 2 must be above 0 and at most 1.5" in result.stderr


def test_with_sequential_looks_the_plan_is_for_the_last_looks_level(plan_config: Path, tmp_path: Path) -> None:
    document = tomllib.loads(plan_config.read_text())
    document["repeats"] = 5
    document["decision"]["looks"] = [3, 5]
    document["decision"]["look_spending"] = "bonferroni"
    looked = write_config(tmp_path / "looks.toml", document)
    result = replaybench("plan", "-c", str(looked), "--load", "0.5", "--pairs", "6")
    assert result.returncode == 0, result.stderr
    assert "rule: KEEP needs tpot_p50's 97.5% CI beyond its margin" in result.stdout
    match = NEEDED.search(result.stdout)
    assert match and int(match.group(2)) >= repeats_needed(plan_config, "0.5")[1]  # a stricter level needs more
    looks = LOOKS_LINE.search(result.stdout)
    assert looks and looks.group(1) == "looks at 3, 5 repeats, at levels 0.025, 0.025 (alpha / 2)", result.stdout
    assert 0 < int(looks.group(2)) <= 100 and 3 <= float(looks.group(3)) <= 5
    # O'Brien-Fleming keeps more of alpha for the last look: its runs clear the margin at least as often
    document["decision"]["look_spending"] = "obrien-fleming"
    obf_config = write_config(tmp_path / "obf.toml", document)
    spent = replaybench("plan", "-c", str(obf_config), "--load", "0.5", "--pairs", "6")
    obf = LOOKS_LINE.search(spent.stdout)
    assert obf and "O'Brien-Fleming spending of alpha 0.05" in obf.group(1)
    assert int(obf.group(2)) >= int(looks.group(2)) and float(obf.group(3)) >= float(looks.group(3))
