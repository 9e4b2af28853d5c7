"""The analysis tables of experiment.toml: defaults, round trip, and one-line errors that name the key."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import tomli_w

from harness.errors import UserError
from harness.records.decision_config import (
    METRIC_DIRECTIONS,
    AnalysisConfig,
    analysis_config_from_mapping,
    load_analysis_config,
)

DOCUMENTED = """
name = "x"                      # tables other than the four analysis ones are ignored here
[slo]
ttft_s = 1.5
itl_s = 0.4
[decision]
alpha = 0.1
target = { metric = "itl_p50", margin = 0.03 }
gate = [{ metric = "ttft_p99", margin = 0.10 }, { metric = "goodput", margin = 0.02, direction = "higher" }]
exploratory = ["e2e_p99"]
request_paired = false
planning_effect = 0.08
server_tpot_tolerance = 0.1
[cost]
gpu_hour_price = 2.0
monthly_requests = 1e9
[quality]
min_identical_fraction = 1.0
"""


def test_documented_tables_parse_and_round_trip_through_toml() -> None:
    config = analysis_config_from_mapping(tomllib.loads(DOCUMENTED), "experiment.toml")
    assert config.slo.ttft_s == 1.5 and config.slo.tpot_s == 0.1  # unspecified keys keep their defaults
    assert config.decision.target.metric == "itl_p50" and config.decision.target.better == "lower"
    assert [rule.better for rule in config.decision.gate] == ["lower", "higher"]
    assert not config.decision.request_paired and config.decision.assumed_effect == 0.08
    assert config.decision.server_tpot_tolerance == 0.1 and AnalysisConfig().decision.server_tpot_tolerance == 0.05
    frozen = tomli_w.dumps(config.model_dump(mode="json", exclude_none=True))
    assert analysis_config_from_mapping(tomllib.loads(frozen), "frozen") == config


def test_frozen_configs_of_older_runs_still_parse_without_the_retired_bootstrap_table() -> None:
    frozen = tomllib.loads(DOCUMENTED + "[decision.bootstrap]\nresamples = 400\nblock_s = 10.0\n")
    assert analysis_config_from_mapping(frozen, "experiment.toml") == analysis_config_from_mapping(
        tomllib.loads(DOCUMENTED), "experiment.toml"
    )


def test_defaults_are_a_valid_rule() -> None:
    config = AnalysisConfig()
    assert {rule.metric for rule in config.decision.decision_rules} <= set(METRIC_DIRECTIONS)
    assert not set(config.decision.exploratory) & {rule.metric for rule in config.decision.decision_rules}


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ("[slo]\nttft = 1.0\n", "unknown key `slo.ttft`"),
        ('[decision]\ntarget = { metric = "tpot_p75" }\n', "`decision.target.metric`"),
        ("[decision]\nalpha = 0.7\n", "`decision.alpha`"),
        ('[decision]\ngate = [{ metric = "tpot_p50" }]\n', "appears twice"),
        ('[decision]\nexploratory = ["tpot_p50"]\n', "also listed as exploratory"),
        ("[cost]\ngpus_per_arm = 0\n", "`cost.gpus_per_arm`"),
        ("[decision]\nplanning_effect = 0.03\n", "must exceed the target margin"),
        ("[decision]\nserver_tpot_tolerance = 0\n", "`decision.server_tpot_tolerance`"),
        ("[decision]\nlooks = [5, 3, 8]\n", "looks [5, 3, 8] must increase"),
        ("[decision]\nlooks = [2, 5]\n", "the first look (2 repeats) is below min_repeats (3)"),
    ],
)
def test_errors_are_one_line_and_name_the_key(document: str, expected: str) -> None:
    with pytest.raises(UserError) as error:
        analysis_config_from_mapping(tomllib.loads(document), "experiment.toml")
    message = str(error.value)
    assert expected in message and message.startswith("experiment.toml: ") and "\n" not in message


def test_unreadable_file_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "experiment.toml"
    path.write_text("[slo\n")
    with pytest.raises(UserError, match="cannot read the experiment config"):
        load_analysis_config(path)
