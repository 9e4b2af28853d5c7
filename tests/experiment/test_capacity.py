"""`replaybench capacity`: the bisection on known attainment curves, then a real search on the embedded engine."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.analysis.model import CapacityEntry
from harness.errors import UserError
from harness.experiment.capacity import Probe, ProbeRun, SearchBounds, find_capacity, judge_probe
from harness.records.result_io import read_results
from tests.conftest import stray_servers
from tests.experiment.support import config_dict, tiny_trace, write_config

TARGET = 0.9


def curve_probe(
    attainment: Callable[[float], float], seen: list[float], cost: Callable[[float], float] = lambda scale: scale
) -> Callable[[float], Probe]:
    """A probe whose every repeat attains `attainment(compression)`; records the scales it was asked for."""

    def probe(scale: float) -> Probe:
        seen.append(scale)
        runs = tuple(ProbeRun(r, True, attainment(1 / scale), cost(scale) * (1 + r)) for r in range(2))
        return judge_probe(scale, runs, TARGET)

    return probe


def falling_at(knee: float) -> Callable[[float], float]:
    """A monotone curve: perfect up to `knee`x compression, then below the target and falling."""
    return lambda compression: 1.0 if compression <= knee else max(0.0, 0.89 - (compression - knee))


def test_bisection_brackets_the_knee_of_a_monotone_curve() -> None:
    seen: list[float] = []
    bounds = SearchBounds(min_scale=0.05, max_scale=1.0, tolerance=0.05)
    found = find_capacity(curve_probe(falling_at(7.3), seen), bounds)
    assert found.limit == "bisected"
    assert seen[:2] == [1.0, 0.05]  # lightest load first, then the heaviest
    assert found.max_time_compression is not None and found.failing is not None
    assert 7.3 / 1.05 <= found.max_time_compression <= 7.3 < found.failing.compression
    assert found.failing.compression / found.max_time_compression <= 1.05 + 1e-9
    assert len(seen) == len(found.probes) <= bounds.max_probes
    # every probe bisected in log space inside the bracket known at the time
    assert all(0.05 <= s <= 1.0 for s in seen) and len(set(seen)) == len(seen)
    # cost at capacity: the mean over the passing probe's repeats (cost(scale) and 2 * cost(scale))
    assert found.cost_per_success_at_capacity == pytest.approx(1.5 * found.passing.time_scale)


@pytest.mark.parametrize("knee", [1.01, 2.0, 3.3, 9.9, 19.5])
def test_bisection_is_within_tolerance_for_any_knee(knee: float) -> None:
    seen: list[float] = []
    found = find_capacity(curve_probe(falling_at(knee), seen), SearchBounds(0.05, 1.0, 0.1))
    assert found.max_time_compression is not None
    assert knee / 1.1 <= found.max_time_compression <= knee


def test_a_capacity_beyond_or_below_the_range_says_so() -> None:
    seen: list[float] = []
    beyond = find_capacity(curve_probe(falling_at(100.0), seen), SearchBounds(0.1, 1.0, 0.05))
    assert (beyond.limit, beyond.max_time_compression, beyond.failing, seen) == ("at_least", 10.0, None, [1.0, 0.1])
    assert "at least" in beyond.note and "--min-scale" in beyond.note
    seen.clear()
    below = find_capacity(curve_probe(falling_at(0.5), seen), SearchBounds(0.1, 1.0, 0.05))
    assert (below.limit, below.max_time_compression, below.cost_per_success_at_capacity) == ("below_range", None, None)
    assert seen == [1.0] and "--max-scale" in below.note


def test_narrow_bounds_that_miss_the_capacity_are_stepped_past_by_their_own_ratio() -> None:
    """Session 18 on the H200: 0.36-0.55 held even at 0.36 and the search had to be run again. With --expand the
    search steps on by the range's ratio (0.55 / 0.36) until a probe fails, then bisects that bracket."""
    seen: list[float] = []
    bounds = SearchBounds(0.36, 0.55, 0.25, expand=2)
    found = find_capacity(curve_probe(falling_at(3.2), seen), bounds)
    assert found.limit == "bisected" and found.failing is not None
    assert seen[:3] == pytest.approx([0.55, 0.36, 0.36 / (0.55 / 0.36)])  # 1.82x, 2.78x held; 4.24x failed
    assert 3.2 / 1.25 <= found.max_time_compression <= 3.2 < found.failing.compression
    assert len(seen) <= bounds.max_probes == 2 + 2 + 1
    seen.clear()  # too light a range: stepped up until a probe holds
    lighter = find_capacity(curve_probe(falling_at(0.8), seen), SearchBounds(0.5, 1.0, 0.1, expand=2))
    assert seen[:2] == [1.0, 2.0] and lighter.limit == "bisected"
    assert 0.8 / 1.1 <= lighter.max_time_compression <= 0.8 < lighter.failing.compression
    seen.clear()  # the steps are bounded: still no failure after them is a lower bound, as without them
    beyond = find_capacity(curve_probe(falling_at(100.0), seen), SearchBounds(0.5, 1.0, 0.1, expand=2))
    assert (beyond.limit, beyond.max_time_compression, seen) == ("at_least", 8.0, [1.0, 0.5, 0.25, 0.125])
    assert "--expand" in beyond.note
    seen.clear()
    below = find_capacity(curve_probe(falling_at(0.1), seen), SearchBounds(0.5, 1.0, 0.1, expand=1))
    assert (below.limit, seen) == ("below_range", [1.0, 2.0]) and below.failing.time_scale == 2.0


def test_a_probe_passes_only_when_every_repeat_holds_the_target() -> None:
    held = judge_probe(0.5, (ProbeRun(0, True, 0.95, 1.0), ProbeRun(1, True, 0.90, 1.0)), TARGET)
    assert held.passed and held.compression == 2.0 and "attained 90.0%" in held.reason
    # mean 0.915 is above the target, but one repeat is not: the probe fails
    missed = judge_probe(0.5, (ProbeRun(0, True, 0.95, 1.0), ProbeRun(1, True, 0.88, 1.0)), TARGET)
    assert not missed.passed and "attained 88.0%: missed" in missed.reason


def test_an_invalid_replay_fails_the_probe_and_says_so() -> None:
    invalid = ProbeRun(1, False, 1.0, 1.0, "replay invalid: p99 send lag 9.00 ms exceeds the 2 ms budget")
    probe = judge_probe(0.25, (ProbeRun(0, True, 1.0, 1.0), invalid), TARGET)
    assert not probe.passed
    assert probe.reason.startswith("1 of 2 replay(s) invalid, counted as failed (r1: replay invalid: p99 send lag")

    def lagging_client(scale: float) -> Probe:  # the client cannot hold schedules beyond 4x
        run = ProbeRun(0, scale >= 0.25, 1.0, 1.0, "" if scale >= 0.25 else "replay invalid: lag")
        return judge_probe(scale, (run,), TARGET)

    found = find_capacity(lagging_client, SearchBounds(0.1, 1.0, 0.05))
    assert found.max_time_compression == pytest.approx(4.0, rel=0.05)
    assert "replay machine, not the server" in found.note


def test_capacity_json_entry_is_what_the_report_reads() -> None:
    found = find_capacity(curve_probe(falling_at(3.0), []), SearchBounds(0.1, 1.0, 0.05))
    entry = json.loads(json.dumps(found.to_json(TARGET)))
    parsed = CapacityEntry.model_validate(entry)
    assert parsed.max_time_compression == found.max_time_compression
    assert parsed.cost_per_success_at_capacity == found.cost_per_success_at_capacity
    assert entry["limit"] == "bisected" and entry["attainment_target"] == TARGET
    assert [p["passed"] for p in entry["probes"]][:2] == [True, False]
    assert entry["probes"][0]["runs"][1] == {
        "repeat": 1,
        "valid": True,
        "attainment": 1.0,
        "cost_per_success": 2.0,
        "reason": "",
        "path": "",
    }


@pytest.mark.parametrize(("low", "high", "tolerance"), [(0.5, 0.5, 0.05), (0.0, 1.0, 0.05), (0.1, 1.0, 0.0)])
def test_bad_bounds_are_user_errors(low: float, high: float, tolerance: float) -> None:
    with pytest.raises(UserError, match=r"--min-scale|--tolerance"):
        SearchBounds(low, high, tolerance)
    with pytest.raises(UserError, match=r"--expand -1 must be 0 or more"):
        SearchBounds(0.1, 1.0, 0.05, expand=-1)


def test_probe_count_bound() -> None:
    assert SearchBounds(0.1, 1.0, 0.05).max_probes == 2 + math.ceil(math.log2(math.log(10) / math.log(1.05)))
    assert SearchBounds(0.99, 1.0, 0.05).max_probes == 2
    assert SearchBounds(0.1, 1.0, 0.05, expand=3).max_probes == SearchBounds(0.1, 1.0, 0.05).max_probes + 3


# ---- end to end on the embedded engine -------------------------------------------------------------------------
# 80 requests of 64 output tokens, 0.2 s apart: compressing the trace raises the decode batch, and the embedded
# engine's baseline step grows faster with the batch than ReplaySSM's (its SSM state is read and written every
# step). In virtual time (`replaybench simulate`), TPOT p90 at 40x is 9.0 ms for the baseline, 7.8 ms for
# replayssm; the baseline falls under 90 % attainment of TPOT <= 8.5 ms at about 22x.
REPLAYBENCH = str(Path(sys.executable).with_name("replaybench"))


@pytest.mark.timing
def test_capacity_end_to_end_replayssm_holds_more_load(tmp_path: Path) -> None:
    trace = tiny_trace(tmp_path / "trace.parquet", requests=80, spacing_s=0.2, output_tokens=64)
    document = config_dict(
        trace, restart_per_repeat=False, slo={"ttft_s": 2.0, "tpot_s": 0.0085}, cost={"gpu_hour_price": 3.6}
    )
    config = write_config(tmp_path / "exp.toml", document)
    result = subprocess.run(
        [
            REPLAYBENCH,
            "capacity",
            "--config",
            str(config),
            "--repeats",
            "1",
            "--min-scale",
            "0.025",
            "--max-scale",
            "0.1",
            "--tolerance",
            "0.25",
            "--output-dir",
            str(tmp_path / "runs"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=os.environ | {"COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stderr
    assert stray_servers() == {}
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("t-capacity-") and (run / "experiment.toml").exists()
    capacity = json.loads((run / "capacity.json").read_text())
    assert set(capacity) == {"baseline", "candidate"}
    base, cand = capacity["baseline"], capacity["candidate"]
    assert base["max_time_compression"] is not None and cand["max_time_compression"] is not None
    assert cand["max_time_compression"] >= base["max_time_compression"]
    assert 10.0 <= base["max_time_compression"] < 40.0 and base["limit"] == "bisected"
    for entry in (base, cand):
        passing = [p for p in entry["probes"] if p["compression"] == entry["max_time_compression"]]
        assert len(passing) == 1 and passing[0]["passed"]
        # cost at capacity: GPU-hours of the passing replay x price / its successful requests
        assert 0 < entry["cost_per_success_at_capacity"] < 3.6 * 5 / 3600 / 80
        for probe in entry["probes"]:
            (only,) = probe["runs"]
            table, meta = read_results(run / only["path"])
            assert table.num_rows == 80 and float(meta["replaybench.time_scale"]) == pytest.approx(probe["time_scale"])
    assert "capacity: largest time compression" in result.stdout and "capacity.json" in result.stdout
    assert "baseline" in result.stdout and "candidate" in result.stdout


def test_capacity_added_to_a_paired_run_shows_in_its_report(tmp_path: Path) -> None:
    """`--run-dir`: the run's frozen config is probed, capacity.json lands beside its results, the report shows it."""
    config = write_config(tmp_path / "exp.toml", config_dict(tiny_trace(tmp_path / "trace.parquet")))
    ran = subprocess.run(
        [REPLAYBENCH, "run", "--config", str(config), "--output-dir", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert ran.returncode == 0, ran.stderr
    (run,) = (tmp_path / "runs").iterdir()
    results = sorted(p.name for p in (run / "results").iterdir())
    probed = subprocess.run(
        [REPLAYBENCH, "capacity", "--run-dir", str(run), "--repeats", "1", "--min-scale", "0.5", "--tolerance", "0.5"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert probed.returncode == 0, probed.stderr
    assert stray_servers() == {}
    capacity = json.loads((run / "capacity.json").read_text())
    # six short requests are no load at all: both arms hold the SLO at the heaviest scale tried
    assert {arm: (e["limit"], e["max_time_compression"]) for arm, e in capacity.items()} == {
        "baseline": ("at_least", 2.0),
        "candidate": ("at_least", 2.0),
    }
    assert sorted(p.name for p in (run / "results").iterdir()) == results  # the paired results are untouched
    assert len(list((run / "capacity").glob("*.parquet"))) == 4
    reported = subprocess.run([REPLAYBENCH, "report", str(run)], capture_output=True, text=True, timeout=240)
    assert reported.returncode == 0, reported.stderr
    html = (run / "index.html").read_text()
    assert "No capacity.json" not in html and "max time compression within SLO" in html and "≥ 2×" in html
    markdown = (run / "summary.md").read_text()
    assert "Capacity (largest time compression within the SLO): baseline ≥ 2× · candidate ≥ 2×\n" in markdown
    assert json.loads((run / "summary.json").read_text())["capacity"]["candidate"]["max_time_compression"] == 2.0
    # the candidate searched again, alone (as after a one-GPU A/B): the baseline's entry, which set the load, stays
    baseline_entry = capacity["baseline"]
    again = subprocess.run(
        [REPLAYBENCH, "capacity", "--run-dir", str(run), "--arm", "candidate", "--repeats", "1", "--min-scale", "0.25",
         "--tolerance", "0.5"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    capacity = json.loads((run / "capacity.json").read_text())
    assert capacity["baseline"] == baseline_entry and capacity["candidate"]["max_time_compression"] == 4.0
    (run / "capacity.json").write_text("{torn")
    torn = subprocess.run(
        [REPLAYBENCH, "capacity", "--run-dir", str(run), "--arm", "candidate", "--repeats", "1"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert torn.returncode == 2 and torn.stderr.count("\n") == 1 and "move it aside" in torn.stderr
    assert (run / "capacity.json").read_text() == "{torn"  # refused before any probe: nothing rewritten


def test_capacity_refuses_bad_options_in_one_line() -> None:
    result = subprocess.run(
        [REPLAYBENCH, "capacity", "--min-scale", "2", "--max-scale", "1"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: --min-scale 2 must be > 0 and below --max-scale 1")
    result = subprocess.run([REPLAYBENCH, "capacity", "--expand", "-1"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "'--expand'" in result.stderr
    result = subprocess.run([REPLAYBENCH, "capacity"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "give --config" in result.stderr


@pytest.mark.timing
def test_searching_only_the_baseline_needs_no_candidate_server_and_ignores_the_load(tmp_path: Path) -> None:
    # How a one-GPU run measures the capacity its `load` is a share of while the candidate is still starting.
    from tests.replay.support import free_port_without_listener

    trace = tiny_trace(tmp_path / "trace.parquet", requests=80, spacing_s=0.2, output_tokens=64)
    document = config_dict(trace, restart_per_repeat=False, slo={"ttft_s": 2.0, "tpot_s": 0.0085})
    document["trace"] = {"path": str(trace), "load": 0.65, "capacity": str(tmp_path / "not-measured-yet")}
    document["arms"]["candidate"] = {"url": f"http://127.0.0.1:{free_port_without_listener()}"}  # type: ignore[index]
    base = [REPLAYBENCH, "capacity", "--config", str(write_config(tmp_path / "exp.toml", document))]
    command = [*base, "--arm", "baseline", "--repeats", "1", "--min-scale", "0.025", "--max-scale", "0.1"]
    command += ["--tolerance", "0.5"]
    result = subprocess.run(
        [*command, "--output-dir", str(tmp_path / "runs")], capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr
    (run,) = (tmp_path / "runs").iterdir()
    capacity = json.loads((run / "capacity.json").read_text())
    assert set(capacity) == {"baseline"} and capacity["baseline"]["limit"] == "bisected"
    wrong = subprocess.run([*base, "--arm", "nobody"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "--arm 'nobody': choose one of baseline, candidate" in wrong.stderr
