"""machine_sampling: which GPUs an engine's telemetry samples, and a sampled file reduced to the row's figures."""

import json
import subprocess
import sys

import pytest

from replayssm_patch.gpu import machine_sampling
from replayssm_patch.gpu.machine_sampling import host_probe_ms, sampled_conditions, telemetry_path, visible_gpus


@pytest.mark.parametrize(("listed", "gpus"), [(None, [0]), ("3", [3]), ("2,5", [2, 5]), ("GPU-1a2b", []), ("", [])])
def test_visible_gpus_follow_cuda_visible_devices(monkeypatch, listed, gpus):
    if listed is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", listed)
    assert visible_gpus() == gpus


def test_two_results_files_in_one_folder_keep_their_samples_apart(tmp_path):
    """Session 33: the host floor's baseline rows (engine_step-h100-floor.json) overwrote the real model's baseline
    samples when both results files' runs wrote into one shared folder under the same run name."""
    real = telemetry_path(tmp_path / "engine_step-h100.json", "baseline-default", 256)
    floor = telemetry_path(tmp_path / "engine_step-h100-floor.json", "baseline-default", 256)
    assert real != floor and real.name == floor.name == "baseline-default-b256.json"
    assert real.parent == tmp_path / "engine_step-h100-telemetry"
    repeat = telemetry_path(tmp_path / "churn.json", "replayssm_fp32-O0", 4, repeat=1)
    assert repeat == tmp_path / "churn-telemetry" / "replayssm_fp32-O0-b4-r1.json"


def test_sampled_conditions_keep_the_clock_share_beside_run_conditions(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({
        "host": [{"t_s": 1.0, "cpu_busy_pct": 40.0, "cpu_steal_pct": 0.0, "load1": 3.0}],
        "gpu": [{"t_s": 1.0, "index": 0, "sm_mhz": 1485.0, "max_sm_mhz": 1980.0, "power_w": 300.0,
                 "temperature_c": 50.0, "utilization_pct": 90.0}],
        "gpu_error": None,
    }))  # fmt: skip
    got = sampled_conditions(path)
    assert got is not None and got["gpu_clock_share"] == 0.75 and got["cpu_busy_mean_pct"] == 40.0
    assert got["host_probe_ms"] > 0
    assert sampled_conditions(tmp_path / "absent.json") is None


def test_the_host_probe_keeps_the_fastest_round(monkeypatch):
    """A round slowed by another process says little of the host's speed: the best of the rounds is kept."""
    clock = iter([0.0, 0.010, 1.0, 1.004, 2.0, 2.007])
    monkeypatch.setattr(machine_sampling.time, "perf_counter", lambda: next(clock))
    assert host_probe_ms(rounds=3) == 4.0


def test_engine_memory_is_the_childrens_resident_memory():
    """vLLM's engine core is a child process: its resident memory is summed; no child, no figure. Run in a fresh
    interpreter each, whose only children are the ones named here."""
    probe = "from replayssm_patch.gpu.machine_sampling import engine_rss_mib; print(engine_rss_mib())"
    alone = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert alone.stdout.strip() == "None"
    with_child = (
        "import subprocess, sys, time\n"
        "hold = \"b = bytearray(64 * 2**20); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(30)\"\n"
        "child = subprocess.Popen([sys.executable, '-c', hold])\n"
        "from replayssm_patch.gpu.machine_sampling import engine_rss_mib\n"
        "for _ in range(200):\n"
        "    rss = engine_rss_mib()\n"
        "    if rss and rss >= 64: break\n"
        "    time.sleep(0.05)\n"
        "child.kill(); print(rss)\n"
    )
    held = subprocess.run([sys.executable, "-c", with_child], capture_output=True, text=True, check=True)
    assert 64 <= float(held.stdout.strip()) < 512
