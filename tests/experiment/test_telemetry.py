"""Host, GPU and server-load sampling while a run replays (experiment/telemetry.py, server_gauges.py), its reduction
per run (analysis/run_conditions.py) and its lines in summary.md (report/conditions_text.py).

The GPU side runs a stand-in `nvidia-smi` put first on PATH: an executable that answers the query as the real
one does (CSV lines every --loop-ms until terminated) and records its arguments; the energy counter, a stand-in
`pynvml` module whose counters grow at a fixed power on the monotonic clock (this box has no NVML library)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from harness.analysis.energy import COUNTER, POWER_SAMPLES, run_energy
from harness.analysis.model import RunConditions, SpecDecodeRun
from harness.analysis.run_conditions import run_conditions
from harness.experiment.server_gauges import parse_gauges
from harness.experiment.telemetry import RunTelemetry, parse_gpu_line
from harness.report.conditions_text import conditions_line, engine_load_line, idle_gpu_spread
from tests.experiment.support import stand_in_nvml
from tests.replay.support import make_trace, replay
from tests.sim.support import start_sim
from tests.support.openai_server import upstream

STAND_IN = """#!{python}
import sys, time
open({args!r}, "w").write(" ".join(sys.argv[1:]))
lines = {lines!r}
loop_ms = next(int(a.split("=")[1]) for a in sys.argv if a.startswith("--loop-ms="))
for line in lines:
    print(line, flush=True)
    time.sleep(loop_ms / 1000)
time.sleep(30)
"""


def wait_for(condition, timeout_s: float = 30.0) -> None:
    """Poll until `condition()` holds (a loaded machine may start the stand-in slowly); fail past the timeout."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the sampler"
        time.sleep(0.02)


def stand_in_nvidia_smi(folder: Path, lines: list[str], monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `nvidia-smi` on PATH printing `lines`, one per --loop-ms; returns the file its arguments go to."""
    folder.mkdir()
    args = folder / "args.txt"
    script = folder / "nvidia-smi"
    script.write_text(STAND_IN.format(python=sys.executable, args=str(args), lines=lines))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))
    return args


def test_a_query_line_becomes_a_sample_and_unreported_fields_are_none():
    assert parse_gpu_line("0, 1980, 1980, 412.35, 51, 97, 3201, 48\n", 1.5) == {
        "t_s": 1.5, "index": 0.0, "sm_mhz": 1980.0, "max_sm_mhz": 1980.0, "power_w": 412.35, "temperature_c": 51.0,
        "utilization_pct": 97.0, "mem_mhz": 3201.0, "memory_temperature_c": 48.0,
    }  # fmt: skip
    assert parse_gpu_line("1, 1755, 1980, [N/A], 60, 40, 3201, 50", 0.0)["power_w"] is None
    assert parse_gpu_line("1, 1755, 1980, 300, 60, 40, 3201, [N/A]", 0.0)["memory_temperature_c"] is None
    assert parse_gpu_line('Field "clocks.max.sm" is not a valid field to query.', 0.0) is None
    assert parse_gpu_line("[N/A], 1755, 1980, 300, 60, 40, 3201, 50", 0.0) is None  # no GPU index: not a sample
    assert parse_gpu_line("0, 1980, 1980, 412.35, 51, 97", 0.0) is None  # fields missing: not a sample


def test_host_and_gpus_are_sampled_for_the_arms_gpus_and_written_on_exit(tmp_path, monkeypatch):
    lines = ["0, 1980, 1980, 400.5, 50, 95, 3201, 60", "0, 1755, 1980, 410.0, 52, 96, 2619, 88",
             "0, 1980, 1980, 405.0, 53, 94, 3201, 70"]  # fmt: skip
    args = stand_in_nvidia_smi(tmp_path / "bin", lines, monkeypatch)
    out = tmp_path / "telemetry" / "baseline-r0.json"
    began_unix = time.time()
    with RunTelemetry(out, gpus=[0], interval_s=0.1) as telemetry:
        sum(i * i for i in range(3_000_000))  # some CPU work to see
        wait_for(lambda: len(telemetry.gpu) == 3 and len(telemetry.host) >= 3)
    payload = json.loads(out.read_text())
    assert args.read_text().split() == [
        "--query-gpu=index,clocks.sm,clocks.max.sm,power.draw,temperature.gpu,utilization.gpu,clocks.mem,"
        "temperature.memory",
        "--format=csv,noheader,nounits", "--loop-ms=100", "--id=0",
    ]  # fmt: skip
    assert [s["sm_mhz"] for s in payload["gpu"]] == [1980.0, 1755.0, 1980.0] and payload["gpu_error"] is None
    assert payload["energy"] == [] and payload["energy_error"].startswith("NVML energy counter not read ("), (
        "no NVML library on this box: the reason is kept"
    )
    assert len(payload["host"]) >= 4 and all(0 <= s["cpu_busy_pct"] <= 100 for s in payload["host"])
    assert max(s["cpu_busy_pct"] for s in payload["host"]) > 0
    conditions = run_conditions(out)
    assert conditions is not None and conditions.samples == len(payload["host"])
    assert (conditions.gpu_sm_mhz_min, conditions.gpu_max_sm_mhz, conditions.gpu_temperature_c_max) == (
        1755.0, 1980.0, 53.0,
    )  # fmt: skip
    assert conditions.gpu_sm_mhz_mean == pytest.approx((1980 * 2 + 1755) / 3, abs=0.01)
    assert (conditions.gpu_mem_mhz_min, conditions.gpu_memory_temperature_c_max) == (2619.0, 88.0)
    # the samples' wall clock lines up with a result file's start, so a run's window picks its samples
    assert began_unix <= payload["t0_unix"] <= began_unix + 1
    t0, last_s = payload["t0_unix"], payload["gpu"][-1]["t_s"]
    window = (t0 + payload["gpu"][0]["t_s"] - 0.01, t0 + last_s + 0.01)
    assert run_energy(out, window).joules == pytest.approx((400.5 + 410.0 + 405.0) / 3 * (window[1] - window[0]))


def test_the_energy_counter_brackets_the_window_and_beats_the_power_samples(tmp_path, monkeypatch):
    # the board reports 100 W once a second while the GPU draws 700 W: the counter is right, the samples are not
    stand_in_nvidia_smi(tmp_path / "bin", ["0, 1980, 1980, 100.0, 50, 95, 3201, 60"] * 20, monkeypatch)
    stand_in_nvml({0: 700.0, 1: 300.0}, monkeypatch)
    out = tmp_path / "telemetry.json"
    with RunTelemetry(out, gpus=[0], interval_s=0.05) as telemetry:
        wait_for(lambda: len(telemetry.energy) >= 4 and len(telemetry.gpu) >= 2)
    payload = json.loads(out.read_text())
    assert payload["energy_error"] is None and {s["index"] for s in payload["energy"]} == {0.0}, "the arm's GPU only"
    first, last = payload["energy"][0]["t_s"], payload["energy"][-1]["t_s"]
    assert first <= 0.05, "read at the start"
    window = (payload["t0_unix"] + first + 0.01, payload["t0_unix"] + last - 0.01)
    energy = run_energy(out, window)
    assert energy.source == COUNTER and energy.joules == pytest.approx(700.0 * (window[1] - window[0]), rel=0.02)
    # a window the counter's reads do not bracket falls back to the power samples, named as such
    beyond = (window[0], window[1] + 5.0)
    energy = run_energy(out, beyond)
    assert energy.source == POWER_SAMPLES and energy.joules == pytest.approx(100.0 * (beyond[1] - beyond[0]))


def test_without_nvidia_smi_only_the_host_is_sampled_and_a_short_run_still_gets_a_sample(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi anywhere
    out = tmp_path / "r.json"
    with RunTelemetry(out, interval_s=10):
        pass
    payload = json.loads(out.read_text())
    assert payload["gpu"] == [] and payload["gpu_error"] == "nvidia-smi not found: GPUs not sampled"
    assert len(payload["host"]) == 1  # the tail sample taken on exit
    conditions = run_conditions(out)
    assert conditions is not None and conditions.gpu_sm_mhz_mean is None and conditions.gpu_error


def test_an_nvidia_smi_that_refuses_the_query_is_named_not_raised(tmp_path, monkeypatch):
    stand_in_nvidia_smi(tmp_path / "bin", ['Field "clocks.max.sm" is not a valid field to query.'], monkeypatch)
    out = tmp_path / "r.json"
    with RunTelemetry(out, interval_s=0.05) as telemetry:
        wait_for(lambda: telemetry.gpu_error is not None)
    payload = json.loads(out.read_text())
    assert (
        payload["gpu"] == []
        and payload["gpu_error"] == 'nvidia-smi: Field "clocks.max.sm" is not a valid field to query.'
    )


def test_a_missing_or_broken_file_is_no_conditions(tmp_path):
    assert run_conditions(tmp_path / "absent.json") is None
    (tmp_path / "bad.json").write_text("{not json")
    assert run_conditions(tmp_path / "bad.json") is None


def _conditions(busy: float, steal: float, sm_mean: float | None, utilization: float = 95.0) -> RunConditions:
    gpu = sm_mean is not None
    return RunConditions(
        samples=40, cpu_busy_mean_pct=busy, cpu_steal_max_pct=steal, load1_max=2.5,
        gpu_sm_mhz_mean=sm_mean, gpu_sm_mhz_min=sm_mean - 100 if gpu else None, gpu_max_sm_mhz=1980.0 if gpu else None,
        gpu_power_w_mean=400.0 if gpu else None, gpu_temperature_c_max=55.0 if gpu else None,
        gpu_utilization_mean_pct=utilization if gpu else None,
        gpu_error=None if gpu else "nvidia-smi not found: GPUs not sampled",
    )  # fmt: skip


class _Run:
    """The fields of a RunRow that the line reads."""

    def __init__(
        self, arm: str, repeat: int, conditions: RunConditions | None, tpot_p50: float | None = None,
        steps_per_s: float | None = None,
    ):  # fmt: skip
        self.arm, self.repeat, self.conditions = arm, repeat, conditions
        self.metrics = {"tpot_p50": tpot_p50}
        self.spec_decode = SpecDecodeRun(engine_steps_per_s=steps_per_s)


def test_the_summary_line_spans_the_runs_and_warns_of_throttling_and_steal():
    runs = [_Run("baseline", 0, _conditions(10, 0.0, 1980)), _Run("candidate", 0, _conditions(30, 3.5, 1700)),
            _Run("baseline", 1, _conditions(20, 0.0, 1500, utilization=10)), _Run("candidate", 1, None)]  # fmt: skip
    line = conditions_line(runs)
    assert line == (
        "Machine during the runs (1-s samples, 3 runs): host CPU busy 10-30 % (run means), steal ≤ 3.5 %, load ≤ 2.5; "
        "GPU SM clock 1,500-1,980 MHz (run means; lowest sample 1,400, maximum 1,980), 400 W mean power, ≤ 55 °C. "
        "⚠️ GPU clock below 90% of its maximum while busy in candidate r0 (86%); CPU steal ≥ 2 % in candidate r0"
    )  # baseline r1 ran at 1,500 MHz but its GPU was idle: not throttling
    assert conditions_line([_Run("baseline", 0, None)]) is None
    hbm = [_conditions(10, 0.0, 1980).model_copy(update={"gpu_mem_mhz_min": mhz, "gpu_memory_temperature_c_max": c})
           for mhz, c in ((3201.0, 61.0), (2619.0, 88.0))]  # fmt: skip
    with_hbm = conditions_line([_Run("baseline", 0, hbm[0]), _Run("candidate", 0, hbm[1])])
    assert "400 W mean power, ≤ 55 °C, memory clock ≥ 2,619 MHz, HBM ≤ 88 °C" in with_hbm
    host_only = conditions_line([_Run("baseline", 0, _conditions(5, 0.0, None))])
    assert host_only.endswith(
        "host CPU busy 5 % (run means), steal ≤ 0.0 %, load ≤ 2.5; nvidia-smi not found: GPUs not sampled"
    )


def _paced(arm: str, repeat: int, tpot_ms: float, busy: float, steps: float | None = None, clock: float = 1945.0):
    return _Run(arm, repeat, _conditions(10, 0.0, clock, utilization=busy), tpot_ms / 1e3, steps)


# Session 18's spec-decode A/B on one H200 (rounded): within each arm the slower runs had the less busy GPU at one
# clock, and took fewer engine steps (vLLM's iteration counter); the candidate's busy share sits lower at the same
# pace (its kernels do less work), so each arm is its own reference
SESSION_18 = [("baseline", 4.97, 83.7, 68.7), ("baseline", 6.63, 75.1, 52.1), ("baseline", 7.95, 68.7, 42.8),
              ("baseline", 5.42, 77.8, 61.9), ("baseline", 5.42, 77.0, 65.7), ("candidate", 6.44, 68.3, 48.8),
              ("candidate", 6.54, 72.0, 54.9), ("candidate", 6.21, 71.5, 55.5), ("candidate", 6.28, 71.4, 56.0),
              ("candidate", 4.68, 81.5, 71.5)]  # fmt: skip


def test_slower_runs_with_a_less_busy_gpu_at_one_clock_point_past_the_kernels():
    runs = [_paced(arm, i, tpot, busy, steps) for i, (arm, tpot, busy, steps) in enumerate(SESSION_18)]
    assert idle_gpu_spread(runs) == (
        "slower runs kept the GPU less busy at one clock (Spearman ρ -0.78 between each run's TPOT p50 and GPU busy "
        "share, both against its arm's median, over 10 runs; busy 68-84 %), and took fewer engine steps (ρ -0.92; "
        "43-72 steps/s): their time went to how the engine batched its work or to its host side, not to slower kernels"
    )
    assert conditions_line(runs).endswith("not to slower kernels")
    no_counter = [_paced(arm, i, tpot, busy) for i, (arm, tpot, busy, _) in enumerate(SESSION_18)]
    assert "engine steps" not in idle_gpu_spread(no_counter)  # a server without vLLM's iteration counter


def test_no_idle_gpu_note_when_the_clock_moved_the_pace_or_too_few_runs_say_it():
    clocked = [_paced(arm, i, tpot, busy, clock=1980.0 - 20 * i) for i, (arm, tpot, busy, _) in enumerate(SESSION_18)]
    assert idle_gpu_spread(clocked) is None  # 1,800-1,980 MHz: throttling, not the engine, is the suspect
    assert idle_gpu_spread([_paced(a, i, t, b) for i, (a, t, b, _) in enumerate(SESSION_18[:5])]) is None
    busier_when_slower = [_paced(arm, i, tpot, 150.0 - busy) for i, (arm, tpot, busy, _) in enumerate(SESSION_18)]
    assert idle_gpu_spread(busier_when_slower) is None  # the GPU did more work: its own kernels, not the engine
    unpaced = [_Run("baseline", i, _conditions(10, 0.0, 1945.0)) for i in range(8)]  # no TPOT measured
    assert idle_gpu_spread(unpaced) is None


VLLM_GAUGES = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="0"} 30.0
vllm:num_requests_running{model_name="m",engine="1"} 28.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m",engine="0"} 2.0
vllm:num_requests_waiting{model_name="m",engine="1"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.41
vllm:kv_cache_usage_perc{model_name="m",engine="1"} 0.57
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{model_name="m",engine="0"} 4.0
"""


def test_the_servers_load_gauges_sum_over_engines_and_the_kv_cache_is_the_fullest():
    assert parse_gauges(VLLM_GAUGES) == {"running": 58.0, "waiting": 2.0, "kv_usage": 0.57}
    assert parse_gauges("# TYPE other gauge\nother 1.0\n") == {}
    with pytest.raises(ValueError):
        parse_gauges("this is not { prometheus text\n")


def test_a_replay_samples_its_servers_batch_queue_and_kv_cache(tmp_path):
    sim = start_sim()
    try:
        trace = make_trace(n=12, gap_s=0.01, prompt_tokens=64, output_tokens=160)
        out = tmp_path / "telemetry" / "candidate-r1.json"
        with RunTelemetry(out, interval_s=0.1, server_url=sim.url, server_interval_s=0.1):
            replay(trace, sim.url, tmp_path / "r.parquet")
    finally:
        sim.stop()
    payload = json.loads(out.read_text())
    assert payload["server_error"] is None and len(payload["server"]) >= 5
    assert max(s["running"] for s in payload["server"]) >= 6  # the requests overlapped in the engine's batch
    assert max(s["kv_usage"] for s in payload["server"]) > 0
    conditions = run_conditions(out)
    assert conditions.server_running_mean > 0 and conditions.server_waiting_max is not None
    assert conditions.server_samples == len(payload["server"])
    assert conditions.server_error is None


def test_a_server_without_the_gauges_is_named_not_raised(tmp_path):
    with upstream("ok") as url:  # a server with no /metrics
        out = tmp_path / "r.json"
        with RunTelemetry(out, interval_s=0.05, server_url=url, server_interval_s=0.05) as telemetry:
            wait_for(lambda: telemetry.server_error is not None)
    conditions = run_conditions(out)
    assert conditions.server_running_mean is None and conditions.server_error.startswith(f"{url}/metrics: ")


def _loaded(arm: str, repeat: int, running: float, waiting: float, most: float, kv: float) -> _Run:
    update = {"server_samples": 12, "server_running_mean": running, "server_waiting_mean": waiting,
              "server_waiting_max": most, "server_kv_usage_max": kv}  # fmt: skip
    return _Run(arm, repeat, _conditions(10, 0.0, None).model_copy(update=update))


def test_the_engine_load_line_gives_each_arms_batch_and_warns_of_queued_runs():
    runs = [_loaded("baseline", 0, 30.0, 0.0, 1, 0.40), _loaded("candidate", 0, 28.0, 0.2, 3, 0.35),
            _loaded("baseline", 1, 32.0, 2.5, 9, 0.52), _loaded("candidate", 1, 27.0, 0.0, 0, 0.33),
            _Run("candidate", 2, None)]  # fmt: skip
    assert engine_load_line(runs) == (
        "Engine load (server gauges, 48 samples in 4 runs, run means): baseline running 31.0, waiting 1.2 (max 9), "
        "KV cache ≤ 52.0% · candidate running 27.5, waiting 0.1 (max 3), KV cache ≤ 35.0%. ⚠️ requests waited for the "
        "batch (mean ≥ 1) in baseline r1 (2.5): those servers ran at their capacity, so their latencies include "
        "queueing"
    )
    assert engine_load_line([_Run("baseline", 0, _conditions(10, 0.0, None))]) is None  # no gauges sampled
