"""The Gated DeltaNet model end to end: `simulate` both arms of a paired run, then `report`; `serve-sim` on it;
the model named the same way in a server command line (`plan`, `check`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.experiment.check import model_config_path
from harness.experiment.config import ArmConfig
from harness.records.result_io import read_results
from harness.records.run_dir import RunDir
from harness.sim.commands import spec_from_serve_args
from harness.sim.simulate import META_SIM_MODEL, META_SIM_POLICY
from tests.sim.support import REPO, get, post_json
from tests.trace.support import replaybench

AZURE_CONV = REPO / "traces/azure-conv-2023.parquet"
ARMS = {"baseline": "baseline", "candidate": "replayssm"}
REPEATS = 3  # the decision rule needs three valid pairs


def simulate(out: Path, *args: str) -> None:
    done = replaybench(
        "simulate", AZURE_CONV, "-o", out, "--start", "600", "--duration", "60", "--time-scale", "0.15",
        "--model-config", "qwen3.5-4b", *args,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "SIMULATED ENGINE" in done.stdout and "model qwen3.5-4b" in done.stdout


@pytest.fixture(scope="module")
def reported(tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    run = RunDir(tmp_path_factory.mktemp("gdn-run"))
    run.results_dir.mkdir(parents=True)
    run.experiment_toml.write_text(
        'name = "sim-gdn"\n[slo]\nttft_s = 2.0\ntpot_s = 0.05\n'
        '[decision]\ntarget = { metric = "tpot_p50", margin = 0.02 }\n'
    )
    for repeat in range(REPEATS):
        for arm, policy in ARMS.items():
            simulate(run.result(arm, repeat), "--policy", policy, "--arm", arm, "--repeat", str(repeat))
    done = replaybench("report", run.root)
    assert done.returncode == 0, done.stderr
    return run


def test_both_arms_ran_the_gdn_model_under_their_policy(reported: RunDir) -> None:
    for repeat in range(REPEATS):
        for arm, policy in ARMS.items():
            table, meta = read_results(reported.result(arm, repeat))
            assert meta[META_SIM_MODEL] == "qwen3.5-4b" and meta[META_SIM_POLICY].startswith(policy)
            assert table.num_rows > 100 and set(table.column("status").to_pylist()) == {200}


def test_the_report_compares_both_arms_and_replayssm_decodes_faster(reported: RunDir) -> None:
    summary = json.loads(reported.summary_json.read_text())
    assert {run["arm"] for run in summary["runs"]} == set(ARMS)
    tpot = next(c for c in summary["comparisons"] if c["metric"] == "tpot_p50")
    assert len(tpot["baseline"]) == len(tpot["candidate"]) == REPEATS
    assert tpot["ratio"] < 0.95 and tpot["ci_high"] < 1.0  # noisy repeats: each pair favours ReplaySSM
    assert all(c < b for b, c in zip(tpot["baseline"], tpot["candidate"], strict=True))
    assert summary["decision"]["outcome"] in ("KEEP", "INCONCLUSIVE")
    assert "simulated engine" in reported.index_html.read_text()


def test_an_unknown_model_name_is_one_clear_line(tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    done = replaybench("simulate", AZURE_CONV, "-o", out, "--model-config", "qwen3.5-5b", "--limit", "5")
    assert done.returncode == 2 and done.stderr.startswith("error: unknown model 'qwen3.5-5b'; choose one of")
    assert "qwen3.5-4b" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_serve_sim_serves_the_gdn_model_with_replayssm(sim_server) -> None:
    sim = sim_server("--model-config", "qwen3.5-35b-a3b", "--policy", "replayssm", "--max-model-len", "4096")
    assert any("30 gated_deltanet layers" in line for line in sim.log_lines)
    assert any("policy replayssm-L16-fp32" in line for line in sim.log_lines)
    assert json.loads(get(sim.url + "/v1/models")[1])["data"][0]["id"] == "qwen3.5-35b-a3b"
    body = {"model": "qwen3.5-35b-a3b", "prompt": "t1 t2", "max_tokens": 20, "min_tokens": 20, "ignore_eos": True}
    status, reply = post_json(sim.url + "/v1/completions", body)
    assert status == 200 and reply["usage"]["completion_tokens"] == 20


def test_a_server_command_names_the_model_the_same_way(tmp_path: Path) -> None:
    spec = spec_from_serve_args(["--port", "0", "--model-config", "qwen3.5-4b", "--policy", "replayssm"], tmp_path)
    assert spec.shape.name == "qwen3.5-4b" and spec.policy.name == "replayssm"
    arm = ArmConfig(command=["python", "-m", "harness.sim", "--model-config", "qwen3.5-4b"], cwd=tmp_path)
    assert model_config_path(arm) == REPO / "configs/models/qwen3.5-4b.json"
