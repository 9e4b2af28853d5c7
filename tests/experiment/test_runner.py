"""Short paired experiments end to end on the embedded engine; the run directory is checked file by file."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from harness.errors import UserError
from harness.experiment.config import ExperimentConfig, load_config, with_ports
from harness.experiment.environment import collect_environment, write_environment
from harness.experiment.rundir import freeze_config, new_run_dir
from harness.experiment.runner import ExperimentRunner
from harness.records.result_io import read_results
from harness.records.run_dir import RunDir
from tests.conftest import stray_servers
from tests.experiment.support import config_dict, sim_command, tiny_trace, write_config


def start_run(tmp_path: Path, **top: object) -> tuple[ExperimentConfig, RunDir]:
    """What `replaybench run` does before the first request: resolve ports, freeze, record the environment."""
    trace = tiny_trace(tmp_path / "trace.parquet")
    config = with_ports(load_config(write_config(tmp_path / "exp.toml", config_dict(trace, **top))))
    run = new_run_dir(tmp_path / "runs", config.name)
    freeze_config(config, run)
    write_environment(run.env_json, collect_environment(config, ["test"]))
    return config, run


def attempts(run: RunDir) -> list[dict[str, object]]:
    return json.loads(run.attempts_json.read_text())


def t0(run: RunDir, arm: str, repeat: int) -> float:
    return float(read_results(run.result(arm, repeat))[1]["replaybench.t0_monotonic"])


def test_abba_run_directory(tmp_path: Path) -> None:
    config, run = start_run(tmp_path)
    ExperimentRunner(config, run).execute()
    log = attempts(run)
    # ABBA: baseline first in repeat 0, candidate first in repeat 1; one accepted attempt each
    assert [(a["arm"], a["repeat"], a["status"], a["final"]) for a in log] == [
        ("baseline", 0, "accepted", True),
        ("candidate", 0, "accepted", True),
        ("candidate", 1, "accepted", True),
        ("baseline", 1, "accepted", True),
    ]
    assert t0(run, "baseline", 0) < t0(run, "candidate", 0) and t0(run, "candidate", 1) < t0(run, "baseline", 1)
    for arm in ("baseline", "candidate"):
        for repeat in (0, 1):
            table, meta = read_results(run.result(arm, repeat))
            assert (meta["replaybench.arm"], meta["replaybench.repeat"]) == (arm, str(repeat))
            assert meta["replaybench.simulated"] == "true" and meta["replaybench.attempt"] == "1"
            assert table.num_rows == 6 and table.column("error").null_count == 6
            assert (run.root / f"attempts/{arm}-r{repeat}-a1.parquet").read_bytes() == run.result(
                arm, repeat
            ).read_bytes()
            assert "replaybench_simulated 1" in run.metrics(arm, repeat, "before").read_text()
            assert "replaybench_simulated 1" in run.metrics(arm, repeat, "after").read_text()
            assert "SIMULATED ENGINE" in run.server_log(arm, repeat).read_text()
    frozen = tomllib.loads(run.experiment_toml.read_text())
    assert frozen["mode"] == "A/B" and frozen["arms"]["baseline"]["port"] > 0
    assert frozen["decision"]["lag_budget_s"] == 0.25
    environment = json.loads(run.env_json.read_text())
    assert environment["servers"]["baseline"]["models"] == ["m"] and environment["python"]
    assert environment["gpu_note"] == "no GPU: embedded engine only" or environment["gpus"]
    assert stray_servers() == {}


def test_simultaneous_arms_share_the_clock_and_servers_can_stay_up(tmp_path: Path) -> None:
    config, run = start_run(tmp_path, order="simultaneous", repeats=2, restart_per_repeat=False)
    ExperimentRunner(config, run).execute()
    assert [(a["arm"], a["repeat"], a["status"]) for a in attempts(run)] == [
        ("baseline", 0, "accepted"),
        ("candidate", 0, "accepted"),
        ("baseline", 1, "accepted"),
        ("candidate", 1, "accepted"),
    ]
    for repeat in (0, 1):
        # both replays ran from one shared t0 on the host's monotonic clock
        assert t0(run, "baseline", repeat) == t0(run, "candidate", repeat)
    # restart_per_repeat = false: each server was started once and served both repeats
    assert sorted(p.name for p in (run.root / "servers").iterdir()) == ["baseline-r0.log", "candidate-r0.log"]
    assert stray_servers() == {}


def test_crashed_server_is_retried_and_every_attempt_kept(tmp_path: Path) -> None:
    marker = tmp_path / "crashed-once"
    crash = " ".join(sim_command("replayssm", "--crash-after-requests", "3"))
    healthy = " ".join(sim_command("replayssm"))
    document_arms = {
        "candidate": {
            "command": ["sh", "-c", f"if [ -e {marker} ]; then exec {healthy}; else touch {marker}; exec {crash}; fi"],
            "startup_timeout_s": 60,
            "stop_grace_s": 5,
        }
    }
    trace = tiny_trace(tmp_path / "trace.parquet")
    base = config_dict(trace, repeats=1, order="abba")
    base["arms"] = base["arms"] | document_arms  # type: ignore[operator]
    config = with_ports(load_config(write_config(tmp_path / "exp.toml", base)))
    run = new_run_dir(tmp_path / "runs", config.name)
    freeze_config(config, run)
    write_environment(run.env_json, collect_environment(config, ["test"]))
    ExperimentRunner(config, run).execute()
    candidate = [a for a in attempts(run) if a["arm"] == "candidate"]
    assert [(a["attempt"], a["status"], a["final"]) for a in candidate] == [
        (1, "crashed", False),
        (2, "accepted", True),
    ]
    assert "server exited with code" in str(candidate[0]["reason"])
    assert (run.root / "attempts/candidate-r0-a1.parquet").exists()  # the crashed attempt's rows are kept
    crashed, _ = read_results(run.root / "attempts/candidate-r0-a1.parquet")
    assert crashed.column("error").null_count < crashed.num_rows  # it saw failures
    assert run.result("candidate", 0).read_bytes() == (run.root / "attempts/candidate-r0-a2.parquet").read_bytes()
    assert run.server_log("candidate", 0).read_text().count("=== replaybench ") == 2  # both launches logged


def test_invalid_runs_are_retried_then_kept_and_labelled(tmp_path: Path) -> None:
    config, run = start_run(
        tmp_path, repeats=1, max_attempts=2, restart_per_repeat=False, decision={"lag_budget_s": 1e-9, "min_repeats": 2}
    )
    ExperimentRunner(config, run).execute()
    baseline = [a for a in attempts(run) if a["arm"] == "baseline"]
    assert [(a["status"], a["final"]) for a in baseline] == [("invalid", False), ("invalid", True)]
    assert "p99 send lag" in str(baseline[1]["reason"]) and "kept as the result: 2 attempt(s)" in str(
        baseline[1]["reason"]
    )
    assert run.result("baseline", 0).exists()


def test_attached_url_arm_that_is_not_running(tmp_path: Path) -> None:
    document = config_dict(tiny_trace(tmp_path / "trace.parquet"), repeats=1, max_attempts=1)
    document["arms"]["baseline"] = {"url": "http://127.0.0.1:9", "startup_timeout_s": 0.5}  # type: ignore[index]
    config = load_config(write_config(tmp_path / "exp.toml", document))
    run = new_run_dir(tmp_path / "runs", config.name)
    with pytest.raises(
        UserError,
        match=r"arm baseline, repeat 0: no attempt produced a result \(arm baseline: "
        r"nothing ready at http://127\.0\.0\.1:9/health",
    ):
        ExperimentRunner(config, run).execute()
    assert attempts(run)[0]["status"] == "crashed"
