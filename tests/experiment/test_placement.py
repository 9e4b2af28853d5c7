"""Fair placement: the arms swap GPUs every repeat (checked on the embedded engine, which logs the GPU it was
given), and ABBA on one GPU keeps both servers resident, with the restart policy recorded in env.json."""

from __future__ import annotations

import json
from pathlib import Path

from harness.experiment.check import Finding, gpu_findings, run_checks
from harness.experiment.config import load_config
from harness.experiment.gpus import GpuInfo
from harness.experiment.placement import placement
from harness.experiment.runner import ExperimentRunner
from harness.records.result_io import read_results
from harness.records.result_schema import META_GPUS
from tests.conftest import stray_servers
from tests.experiment.support import config_dict, sim_command, tiny_trace, write_config
from tests.experiment.test_runner import start_run


def on_gpus(document: dict[str, object], baseline: list[int], candidate: list[int]) -> dict[str, object]:
    arms = document["arms"]
    arms["baseline"]["gpus"], arms["candidate"]["gpus"] = baseline, candidate  # type: ignore[index]
    return document


def test_swap_alternates_and_only_moves_what_can_move(tmp_path: Path) -> None:
    def config(**top: object) -> object:
        document = on_gpus(config_dict(Path("t.parquet"), order="simultaneous", **top), [0], [1])
        return load_config(write_config(tmp_path / "c.toml", document))

    swapping = config()
    assert [placement(swapping, k).gpus for k in range(4)] == [
        {"baseline": (0,), "candidate": (1,)},
        {"baseline": (1,), "candidate": (0,)},
        {"baseline": (0,), "candidate": (1,)},
        {"baseline": (1,), "candidate": (0,)},
    ]
    assert [placement(swapping, k).swapped for k in range(3)] == [False, True, False]
    assert not placement(config(placement="fixed"), 1).swapped
    attached = on_gpus(config_dict(Path("t.parquet"), order="simultaneous"), [0], [1])
    attached["arms"]["candidate"] = {"url": "http://127.0.0.1:9", "gpus": [1]}  # type: ignore[index]
    assert placement(load_config(write_config(tmp_path / "c.toml", attached)), 1).gpus["baseline"] == (0,)


def test_simultaneous_repeats_swap_gpus_and_the_servers_are_started_there(tmp_path: Path) -> None:
    arms = on_gpus(config_dict(Path("unused")), [0], [1])["arms"]
    arms["baseline"]["command"] = sim_command("baseline", "--noise")  # type: ignore[index]
    arms["candidate"]["command"] = sim_command("replayssm", "--noise")  # type: ignore[index]
    config, run = start_run(tmp_path, order="simultaneous", repeats=3, restart_per_repeat=False, arms=arms)
    ExperimentRunner(config, run).execute()
    env = json.loads(run.env_json.read_text())["placement"]
    assert env["policy"] == "swap" and env["swaps"] and env["restart_per_repeat"] is False
    assert [(r["repeat"], r["baseline"], r["candidate"], r["swapped"]) for r in env["repeats"]] == [
        (0, [0], [1], False),
        (1, [1], [0], True),
        (2, [0], [1], False),
    ]
    for repeat, (base_gpu, cand_gpu) in enumerate([("0", "1"), ("1", "0"), ("0", "1")]):
        for arm, gpu in (("baseline", base_gpu), ("candidate", cand_gpu)):
            assert read_results(run.result(arm, repeat))[1][META_GPUS] == gpu
            # servers kept up between repeats are restarted when the swap moves them: one log per repeat
            log = run.server_log(arm, repeat).read_text()
            assert f"CUDA_VISIBLE_DEVICES={gpu} (no GPU is used)" in log
            # the embedded engine's noise is seeded by the arm and repeat the runner told it
            assert f"seed 0, repeat {repeat}, arm {arm}" in log
    assert stray_servers() == {}


def test_abba_on_one_gpu_keeps_both_servers_resident_and_says_so(tmp_path: Path) -> None:
    arms = on_gpus(config_dict(Path("unused")), [0], [0])["arms"]
    config, run = start_run(tmp_path, order="abba", repeats=2, restart_per_repeat=False, arms=arms)
    ExperimentRunner(config, run).execute()
    env = json.loads(run.env_json.read_text())["placement"]
    assert env["note"] == "both arms on the same GPUs [0]: nothing to swap" and not env["swaps"]
    assert env["restart"].startswith("servers stay up across repeats, both resident at once")
    assert [(r["baseline"], r["candidate"]) for r in env["repeats"]] == [([0], [0]), ([0], [0])]
    # each server was started once, in repeat 0, and served both repeats
    assert run.server_log("baseline", 0).exists() and run.server_log("candidate", 0).exists()
    assert not run.server_log("baseline", 1).exists() and not run.server_log("candidate", 1).exists()
    assert [a["status"] for a in json.loads(run.attempts_json.read_text())] == ["accepted"] * 4
    one_h200 = [GpuInfo(0, "NVIDIA H200", 143771, "580", "GPU-0")]
    assert gpu_findings(config, one_h200)[-1] == Finding(
        "ok",
        "gpus",
        "both servers stay resident on GPU(s) [0] and replay one at a time; each must fit in its share of the "
        "memory (vLLM: --gpu-memory-utilization 0.45 each)",
    )
    assert stray_servers() == {}


def test_check_says_when_placement_is_not_balanced(tmp_path: Path) -> None:
    trace = tiny_trace(tmp_path / "trace.parquet")

    def placement_finding(**top: object) -> tuple[str, str]:
        document = on_gpus(config_dict(trace, order="simultaneous", **top), [0], [1])
        finding = next(
            f for f in run_checks(load_config(write_config(tmp_path / "c.toml", document))) if f.topic == "placement"
        )
        return finding.level, finding.message

    assert placement_finding(repeats=4) == (
        "ok",
        "arms exchange GPUs every repeat: baseline on [0] in even repeats, on [1] in odd ones",
    )
    level, message = placement_finding(repeats=5)
    assert level == "warn" and message.endswith("5 repeats leave one placement more often: use an even number")
    level, message = placement_finding(repeats=4, placement="fixed")
    assert level == "warn" and "arm and GPU are confounded; run an A/A" in message
