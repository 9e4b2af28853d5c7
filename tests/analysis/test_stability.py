"""Stability detectors: overloaded vs light runs of the embedded engine, a backlog of known growth, the load
read from result metadata or capacity.json, a declared load the runs contradict, drift over the repeats, and the
report's banner."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import tomli_w

from harness.analysis.analyse import analyse_run_dir, time_blocks
from harness.analysis.load_reference import load_from_completion_share
from harness.analysis.model import Stability
from harness.analysis.run_metrics import load_run
from harness.analysis.stability import run_stability
from harness.records.decision_config import AnalysisConfig
from harness.records.result_io import read_results, write_results
from harness.records.result_schema import META_ARM, META_LOAD_SHARE, META_REPEAT
from harness.records.run_dir import RunDir
from harness.report.build import build_report
from harness.report.text_outputs import load_text, summary_markdown
from tests.support.synthetic_results import Scenario, write_run_dir
from tests.trace.support import REPO, replaybench

LIGHT, OVERLOADED = 0.45, 0.25  # time scales of a 150 s Azure conv slice: ~66 % and ~119 % of capacity (review §2)
REPEATS = 3


def simulated_run_dir(root: Path, source: Path, extra_meta: dict[str, str] | None = None) -> RunDir:
    """A paired run directory whose every (arm, repeat) is the same simulated result file."""
    run = RunDir(root)
    run.results_dir.mkdir(parents=True)
    table, meta = read_results(source)
    for repeat in range(REPEATS):
        for arm in ("baseline", "candidate"):
            fields = {META_ARM: arm, META_REPEAT: str(repeat)} | (extra_meta or {})
            write_results(run.result(arm, repeat), table, meta | fields)
    run.experiment_toml.write_text(tomli_w.dumps({"name": root.name, "slo": {"ttft_s": 2.0, "tpot_s": 0.05}}))
    return run


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> dict[float, Path]:
    out = tmp_path_factory.mktemp("simulated")
    files = {}
    for scale in (LIGHT, OVERLOADED):
        path = out / f"sim-{scale}.parquet"
        done = replaybench(
            "simulate", REPO / "traces/azure-conv-2023.parquet", "-o", path, "--start", "600", "--duration", "150",
            "--time-scale", str(scale), "--max-model-len", "8192", "--model-config",
            REPO / "configs/models/nemotron-h-8b.json",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        files[scale] = path
    return files


@pytest.fixture(scope="module")
def reports(simulated: dict[float, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[float, RunDir]:
    runs = {}
    for scale, source in simulated.items():
        runs[scale] = simulated_run_dir(tmp_path_factory.mktemp(f"run-{scale}"), source)
        build_report(runs[scale].root)
    return runs


def test_overloaded_run_carries_the_capacity_banner_and_a_light_one_does_not(reports: dict[float, RunDir]) -> None:
    heavy = json.loads(reports[OVERLOADED].summary_json.read_text())["stability"]
    assert heavy["load_class"] == "past capacity"
    assert heavy["banner"].startswith("The baseline ran at ")
    assert "1% step-time change moves TPOT p50 ~" in heavy["banner"] and "run at ~65% of capacity" in heavy["banner"]
    assert heavy["suggested_time_scale"] > OVERLOADED
    assert 'id="capacity-warning"' in reports[OVERLOADED].index_html.read_text()
    assert "⚠️ **Past capacity.**" in reports[OVERLOADED].summary_md.read_text()

    light = json.loads(reports[LIGHT].summary_json.read_text())["stability"]
    assert light["load_class"] == "below capacity" and light["banner"] is None
    assert not any(d["fired"] for d in light["detectors"])
    assert 'id="capacity-warning"' not in reports[LIGHT].index_html.read_text()
    assert "capacity.**" not in reports[LIGHT].summary_md.read_text()
    # no load declared: the share is unknown, but what the runs' detectors said is stated
    assert "Load: unknown share of capacity (the runs' detectors say below capacity); set `[trace] load = 0.65`" in (
        reports[LIGHT].summary_md.read_text()
    )


def test_an_unknown_load_says_why_it_is_unknown() -> None:
    """The demo's 60-request replays span ~6 s of arrivals: no load declared, nothing for the detectors to judge."""
    fields = {"load_class": "unknown", "load_share": None, "load_at_least": False, "load_source": "",
              "tpot_p50_elasticity": None, "ttft_p50_elasticity": None, "suggested_load": 0.65,
              "suggested_time_scale_factor": None, "suggested_time_scale": None, "detectors": [], "runs": [],
              "banner": None}  # fmt: skip
    text = load_text(Stability.model_validate(fields))
    assert text.startswith("unknown share of capacity (no [trace] load set, and no replay's arrivals spanned the 30 s")
    assert text.endswith("or run `replaybench capacity`")


def test_detectors_see_what_the_review_saw(reports: dict[float, RunDir]) -> None:
    # review §2: completed before the last arrival 0.93 at 66 % and 0.53 at 119 % load; backlog growth small
    # below capacity and ~0.27 of the arrival rate at 119 %
    values = {}
    for scale, run in reports.items():
        stability = analyse_run_dir(run.root).summary.stability
        values[scale] = {d.name: d.value for d in stability.detectors}
    completed, growth = "share of requests completed before the last arrival", "in-flight growth"
    growth = next(name for name in values[LIGHT] if name.startswith(growth))
    assert values[LIGHT][completed] > 0.9 and values[OVERLOADED][completed] < 0.7
    assert values[LIGHT][growth] < 0.1 < values[OVERLOADED][growth]


def _load(run: RunDir, arm: str, repeat: int):
    config = AnalysisConfig()
    blocks = time_blocks([run.result(arm, repeat)], 10.0)
    return load_run(run.result(arm, repeat), blocks, config.slo, config.decision, config.cost)


def test_a_backlog_of_known_growth_is_measured(tmp_path: Path) -> None:
    # Every request takes a quarter of its arrival time: at time g the requests in flight arrived in
    # (g / 1.25, g], so the in-flight count grows at rate x 0.25 / 1.25 = 0.2 of the arrival rate, and the
    # requests that finish before the last arrival T are those that arrived before T / 1.25: 80 %.
    run = write_run_dir(tmp_path, Scenario(repeats=1, requests=4000, failure_rate=0.0))
    path = run.result("baseline", 0)
    table, meta = read_results(path)
    intended = np.linspace(0.0, 80.0, table.num_rows)  # evenly spaced: Poisson counts would blur the slope
    e2e = 0.25 * intended + 1e-3
    for name, values in (("intended_s", intended), ("sent_s", intended), ("e2e_s", e2e), ("ttft_s", e2e / 2)):
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(values))
    write_results(path, table, meta)
    stability = run_stability(_load(run, "baseline", 0))
    assert stability.backlog_growth == pytest.approx(0.2, abs=0.01)
    assert stability.completed_before_last_arrival == pytest.approx(0.8, abs=0.01)
    assert stability.arrival_rate == pytest.approx(50.0, rel=0.05)


def test_load_share_comes_from_result_metadata_and_sets_the_amplification(
    simulated: dict[float, Path], tmp_path: Path
) -> None:
    run = simulated_run_dir(tmp_path / "run", simulated[LIGHT], {META_LOAD_SHARE: "0.95"})
    stability = analyse_run_dir(run.root).summary.stability
    assert stability.load_class == "near capacity" and stability.load_share == pytest.approx(0.95)
    assert META_LOAD_SHARE in stability.load_source
    assert stability.tpot_p50_elasticity == pytest.approx(5.6 + 0.3 * 2 / 6)  # review table, 93 % -> 99 %
    assert stability.suggested_time_scale == pytest.approx(LIGHT * 0.95 / 0.65)
    assert "~95% of its capacity" in stability.banner and "TPOT p50 ~5.7%" in stability.banner
    # above the suggested load the advice is to lower it there, by the declared load
    assert "run at ~65% of capacity: time scale x1.46 (time_scale = 0.658)" in stability.banner
    assert "its own runs disagree" not in stability.banner


@pytest.mark.parametrize("declared", ["0.65", "0.7"])
def test_a_light_declared_load_that_the_runs_contradict_is_named_not_repeated(
    simulated: dict[float, Path], tmp_path: Path, declared: str
) -> None:
    # The overloaded replay (~119 % of capacity) labelled as a light one: the declared load fires nothing, the
    # runs' own detectors do. "Run at ~65 %: x1.00" would repeat the run; the runs' own estimate is the way out.
    run = simulated_run_dir(tmp_path / "run", simulated[OVERLOADED], {META_LOAD_SHARE: declared})
    stability = analyse_run_dir(run.root).summary.stability
    assert stability.load_class == "past capacity" and stability.load_share == pytest.approx(float(declared))
    assert not any(d.fired for d in stability.detectors if d.name == "load share of capacity")
    completion = next(d.value for d in stability.detectors if d.name.startswith("share of requests completed"))
    runs_load, at_least = load_from_completion_share(completion)
    assert stability.runs_load_share == pytest.approx(runs_load) and runs_load > 1.0
    assert stability.suggested_time_scale_factor == pytest.approx(runs_load / 0.65)
    assert stability.suggested_time_scale == pytest.approx(OVERLOADED * runs_load / 0.65)
    banner = stability.banner
    assert f"set to ~{float(declared):.0%} of its capacity" in banner and "its own runs disagree" in banner
    assert f"puts the load at {'≥' if at_least else '~'}{runs_load:.0%}" in banner
    assert "capacity was likely over-estimated, or the servers slowed" in banner
    assert "`replaybench capacity --repeats 3 --tolerance 0.05`" in banner
    assert "as the runs estimate it (only an estimate" in banner and f"x{runs_load / 0.65:.2f}" in banner
    assert "x1.00" not in banner and "run at ~65% of capacity" not in banner


def test_load_share_comes_from_capacity_json_when_the_results_carry_none(
    simulated: dict[float, Path], tmp_path: Path
) -> None:
    run = simulated_run_dir(tmp_path / "run", simulated[LIGHT])
    compression = 1 / LIGHT
    (run.root / "capacity.json").write_text(
        json.dumps({"baseline": {"max_time_compression": compression / 1.1, "limit": "bisected"}})
    )
    stability = analyse_run_dir(run.root).summary.stability
    assert stability.load_share == pytest.approx(1.1) and stability.load_class == "past capacity"
    assert stability.load_source.startswith("capacity.json")


@pytest.mark.parametrize(("seed", "expected"), [(1, "near capacity"), (2, "below capacity")])
def test_amplified_spread_with_arms_apart_points_at_capacity(tmp_path: Path, seed: int, expected: str) -> None:
    # No shared per-repeat factor and a large per-run one: the baseline's TPOT p50 spreads over twice the A/A
    # floor; with seed 1 the arms also move apart (correlation < 0), with seed 2 they do not.
    scenario = Scenario(repeats=5, requests=700, shared_noise=0.0, run_noise=0.12, seed=seed)  # 35 s: judged
    summary = analyse_run_dir(write_run_dir(tmp_path, scenario).root).summary
    log_tpot = {
        arm: np.log([r.metrics["tpot_p50"] for r in summary.runs if r.arm == arm]) for arm in ("baseline", "candidate")
    }
    values = {d.name: d.value for d in summary.stability.detectors}
    assert values["between-repeat sd of the baseline's log TPOT p50"] == pytest.approx(
        np.std(log_tpot["baseline"], ddof=1)
    )
    correlation = np.corrcoef(log_tpot["baseline"], log_tpot["candidate"])[0, 1]
    assert values["correlation of the arms' log TPOT p50 across repeats"] == pytest.approx(correlation)
    assert summary.stability.load_class == expected
    if expected == "near capacity":
        assert "measure it with `replaybench capacity`" in summary.stability.banner


DRIFT = "change of the baseline's log TPOT p50 from the first repeat to the last (Theil-Sen, absolute)"


def test_a_drift_like_the_h200_runs_fires_as_its_own_sentence(tmp_path: Path) -> None:
    # The H200 qwen3.5-4b A/B's baseline TPOT p50 by repeat, 13.85 / 15.49 / 25.07 / 28.86 / 27.66 ms, on both
    # arms: a server slowing down, not a load class.
    rise = (1.0, 1.12, 1.81, 2.08, 2.0)
    scenario = Scenario(repeats=5, requests=700, shared_noise=0.03, run_noise=0.03, drift=rise)
    summary = analyse_run_dir(write_run_dir(tmp_path, scenario).root).summary
    stability = summary.stability
    detector = next(d for d in stability.detectors if d.name == DRIFT)
    assert detector.fired and detector.means == "drift" and stability.drifted
    assert stability.drift.baseline.ratio == pytest.approx(2.0, rel=0.15) and stability.drift.baseline.ci_low > 1
    assert stability.drift.candidate.ratio == pytest.approx(2.0, rel=0.15) and stability.drift.paired.steady
    assert stability.load_class == "below capacity"  # drift is no load class
    banner = stability.banner
    assert banner.startswith("The servers drifted: the baseline's TPOT p50 rose x")
    assert "the candidate's x" in banner and "(alike: their ratio shows no trend)" in banner
    assert "`restart_per_repeat = true`" in banner and f"{DRIFT} {detector.value:.3g} >= 0.14" in banner
    assert stability.headline == "Servers drifted"
    assert f"> ⚠️ **Servers drifted.** {banner}" in summary_markdown(summary)


def test_a_drift_under_fresh_servers_does_not_advise_restarting_them(tmp_path: Path) -> None:
    """The demo (restart_per_repeat = true) drifted once on a busy 2-core box, and its banner told the user to
    turn on what was on: with fresh servers every repeat the advice is where they ran."""
    rise = (1.0, 1.12, 1.81, 2.08, 2.0)
    scenario = Scenario(repeats=5, requests=700, shared_noise=0.03, run_noise=0.03, drift=rise,
                        config={"restart_per_repeat": True})  # fmt: skip
    banner = analyse_run_dir(write_run_dir(tmp_path, scenario).root).summary.stability.banner
    assert banner.startswith("The servers drifted:") and "`restart_per_repeat = true`" not in banner
    assert "the servers were already fresh for every repeat, so find its cause in what they ran on" in banner


def test_a_flat_noisy_series_does_not_drift_even_past_the_threshold(tmp_path: Path) -> None:
    # Shared per-repeat noise ~2.3x the A/A floor; with this seed the Theil-Sen change of the flat series
    # passes the threshold, but its interval holds no change, so nothing fires.
    scenario = Scenario(repeats=5, requests=700, shared_noise=0.08, run_noise=0.02, seed=12)
    stability = analyse_run_dir(write_run_dir(tmp_path, scenario).root).summary.stability
    detector = next(d for d in stability.detectors if d.name == DRIFT)
    assert detector.value >= detector.threshold and stability.drift.baseline.steady
    assert not detector.fired and not stability.drifted and stability.banner is None
