"""`[trace] load`: a share of the baseline's capacity becomes a frozen time scale, and every report states it."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest

from harness.errors import UserError
from harness.experiment.config import load_config
from harness.experiment.rundir import freeze_config
from harness.records.result_io import read_results
from harness.records.result_schema import META_CAPACITY_SOURCE, META_LOAD_SHARE, META_TIME_SCALE
from harness.records.run_dir import RunDir
from tests.experiment.support import config_dict, tiny_trace, write_config
from tests.experiment.test_cli import only_run_dir, replaybench
from tests.trace.support import REPO

CAPACITY_SCALE = 0.3  # the baseline's time scale at capacity in the cached capacity.json


def with_trace(trace: Path, **keys: object) -> dict[str, object]:
    """The test config with these `[trace]` keys."""
    return config_dict(trace) | {"trace": {"path": str(trace), **keys}}


def capacity_dir(tmp_path: Path, trace: Path, scale: float = CAPACITY_SCALE, **trace_keys: object) -> Path:
    """What `replaybench capacity --config` leaves: the frozen experiment and its capacity.json."""
    root = tmp_path / "capacity-run"
    root.mkdir()
    measured = write_config(tmp_path / "measured.toml", with_trace(trace, **trace_keys))
    freeze_config(load_config(measured), RunDir(root))
    entry = {"limit": "bisected", "time_scale_at_capacity": scale, "max_time_compression": 1 / scale}
    (root / "capacity.json").write_text(json.dumps({"baseline": entry}))
    return root


def load_document(trace: Path, capacity: Path) -> dict[str, object]:
    return with_trace(trace, load=0.65, capacity=str(capacity))


def test_bad_loads_are_one_line_errors(tmp_path: Path) -> None:
    trace = tmp_path / "t.parquet"
    for value in (0, -0.2, 1.6):
        document = with_trace(trace, load=value)
        with pytest.raises(UserError, match=rf"`trace`: `load` = {value:g} must be above 0 and at most 1.5"):
            load_config(write_config(tmp_path / "c.toml", document))
    both = with_trace(trace, load=0.65, time_scale=0.5)
    with pytest.raises(UserError, match=r"give either `load` \(a share of capacity\) or `time_scale`, not both"):
        load_config(write_config(tmp_path / "c.toml", both))
    stray = with_trace(trace, capacity="somewhere")
    with pytest.raises(UserError, match=r"`capacity` and `load_basis` only go with `load`"):
        load_config(write_config(tmp_path / "c.toml", stray))


def test_load_becomes_a_frozen_time_scale_that_resume_keeps(tmp_path: Path) -> None:
    trace = tiny_trace(tmp_path / "trace.parquet")
    capacity = capacity_dir(tmp_path, trace)
    config = write_config(tmp_path / "exp.toml", load_document(trace, capacity))
    checked = replaybench("check", str(config))
    assert checked.returncode == 0, checked.stderr
    assert "load      load 65% of the baseline's capacity: time scale 0.4615 (capacity at 0.3, from" in checked.stdout
    result = replaybench("run", "--config", str(config), "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert f"load: ~65% of the baseline's capacity (result metadata {META_LOAD_SHARE};" in result.stdout
    run = RunDir(only_run_dir(tmp_path / "out"))
    frozen_text = run.experiment_toml.read_text()
    frozen = tomllib.loads(frozen_text)["trace"]
    assert frozen["load"] == 0.65 and frozen["time_scale"] == pytest.approx(CAPACITY_SCALE / 0.65)
    assert frozen["load_basis"] == {
        "capacity_time_scale": CAPACITY_SCALE,
        "capacity_source": str(capacity / "capacity.json"),
    }
    assert (run.root / "capacity.json").read_text() == (capacity / "capacity.json").read_text()
    for arm in ("baseline", "candidate"):
        meta = read_results(run.result(arm, 1))[1]
        assert float(meta[META_TIME_SCALE]) == pytest.approx(CAPACITY_SCALE / 0.65) and meta[META_LOAD_SHARE] == "0.65"
        assert meta[META_CAPACITY_SOURCE] == str(capacity / "capacity.json")
    stability = json.loads(run.summary_json.read_text())["stability"]
    assert stability["load_share"] == 0.65 and {r["load_share"] for r in stability["runs"]} == {0.65}
    source = f"(result metadata {META_LOAD_SHARE}; capacity from {capacity / 'capacity.json'})"
    assert f"Load: ~65% of the baseline's capacity {source}" in run.summary_md.read_text()
    assert "Load: ~65% of the baseline&#39;s capacity" in run.index_html.read_text()

    # repeat 1 was cut short; meanwhile the cached capacity changed: the resumed repeat keeps the frozen scale
    (capacity / "capacity.json").write_text(
        json.dumps({"baseline": {"limit": "bisected", "time_scale_at_capacity": 0.9}})
    )
    log = json.loads(run.attempts_json.read_text())
    for entry in log:
        if entry["repeat"] == 1 and entry["arm"] == "candidate":
            entry["final"], entry["status"] = False, "retried"
    run.attempts_json.write_text(json.dumps(log))
    result = replaybench("run", "--resume", str(run.root))
    assert result.returncode == 0, result.stderr
    assert run.experiment_toml.read_text() == frozen_text
    for arm in ("baseline", "candidate"):
        meta = read_results(run.result(arm, 1))[1]
        assert meta["replaybench.attempt"] == "2"  # run again, at the frozen time scale and load share
        assert float(meta[META_TIME_SCALE]) == pytest.approx(CAPACITY_SCALE / 0.65) and meta[META_LOAD_SHARE] == "0.65"


def test_a_capacity_measured_for_another_slice_or_an_open_search_is_refused(tmp_path: Path) -> None:
    trace = tiny_trace(tmp_path / "trace.parquet")
    other = capacity_dir(tmp_path, trace, limit=3)
    config = write_config(tmp_path / "exp.toml", load_document(trace, other))
    result = replaybench("run", "--config", str(config), "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: preflight check failed (1 problem(s)), first: trace.capacity: {other / 'capacity.json'} was "
        "measured with a different trace.limit; re-run `replaybench capacity --config` with this experiment, or "
        "remove trace.capacity to probe first"
    ]
    (other / "capacity.json").write_text(json.dumps({"baseline": {"limit": "at_least", "time_scale_at_capacity": 0.1}}))
    from harness.experiment.load import baseline_time_scale

    with pytest.raises(UserError, match="held its SLO even at the heaviest load probed"):
        baseline_time_scale(json.loads((other / "capacity.json").read_text()), "capacity.json")


def test_a_virtual_probe_needs_a_load_without_capacity_and_an_embedded_baseline(tmp_path: Path) -> None:
    trace = tiny_trace(tmp_path / "trace.parquet")
    for keys in ({"capacity_probe": "virtual"}, {"load": 0.65, "capacity": "c", "capacity_probe": "virtual"}):
        with pytest.raises(UserError, match=r'`capacity_probe = "virtual"` says how a `load` without `capacity`'):
            load_config(write_config(tmp_path / "c.toml", with_trace(trace, **keys)))
    document = with_trace(trace, load=0.65, capacity_probe="virtual")
    simulated = write_config(tmp_path / "sim.toml", document)
    checked = replaybench("check", str(simulated))
    assert "load      load 65% of the baseline's capacity (time scale set once the capacity is simulated in " in (
        checked.stdout
    )
    tiny = replaybench("run", "--config", str(simulated), "--output-dir", str(tmp_path / "tiny"))
    assert tiny.returncode == 2 and len(tiny.stderr.strip().splitlines()) == 1  # a handful of requests: no capacity
    assert "the slice is too small to load it; give a longer slice ([trace] duration_s / limit)" in tiny.stderr
    document["arms"]["baseline"]["command"] = [sys.executable, "-m", "http.server", "{port}"]  # not the embedded engine
    other = write_config(tmp_path / "other.toml", document)
    result = replaybench("run", "--config", str(other), "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert 'capacity_probe = "virtual" simulates an embedded-engine baseline (serve-sim)' in result.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_the_demos_load_comes_from_its_baselines_capacity_in_virtual_time() -> None:
    """configs/demo.toml: 150 requests of the Azure conversations from second 600; the noise-free simulated baseline
    holds its SLO up to 4.85x compression (a replay probe of a 200-request slice found 4.07x where virtual time found
    4.40x), so 65 % of it is a time scale of ~0.318."""
    from harness.experiment.capacity_commands import virtual_capacity

    config = load_config(REPO / "configs" / "demo.toml")
    assert config.trace.load == 0.65 and config.trace.capacity_probe == "virtual"
    assert virtual_capacity(config) == pytest.approx(0.2064, abs=0.002)
