"""`replaybench simulate` on a slice of the Azure conversation trace: a valid, simulated result file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.records.result_io import read_results
from harness.records.result_schema import META_SIMULATED, META_TIME_SCALE
from harness.sim.cost_model import load_factors
from harness.sim.engine_spec import EngineSpec
from harness.sim.gpus import get_gpu
from harness.sim.model_config import load_model_shape
from harness.sim.simulate import simulate_trace
from harness.sim.state_policy import StatePolicy
from harness.trace.model import Trace
from tests.sim.support import REPO
from tests.trace.support import replaybench

AZURE_CONV = REPO / "traces/azure-conv-2023.parquet"


@pytest.fixture(scope="module")
def azure_slice(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "azure-conv-slice.parquet"
    Trace.read(AZURE_CONV).slice(start_s=600, limit=300).write(path)
    return path


def test_simulate_writes_a_valid_simulated_result_file(azure_slice: Path, tmp_path: Path) -> None:
    out = tmp_path / "baseline-r1.parquet"
    done = replaybench("simulate", str(azure_slice), "-o", str(out), "--time-scale", "0.5", "--arm", "baseline")
    assert done.returncode == 0, done.stderr
    assert "SIMULATED ENGINE" in done.stdout
    table, meta = read_results(out)
    assert meta[META_SIMULATED] == "true" and meta[META_TIME_SCALE] == "0.5"
    rows = table.to_pylist()
    trace = Trace.read(azure_slice).table.to_pylist()
    assert len(rows) == len(trace) == 300
    expected = {r["request_id"]: r for r in trace}
    for row in rows:
        source = expected[row["request_id"]]
        assert row["arm"] == "baseline" and row["repeat"] == 0 and row["status"] == 200 and row["error"] is None
        assert row["intended_s"] == pytest.approx(source["arrival_s"] * 0.5)
        assert row["output_tokens"] == row["expected_output_tokens"] == source["output_tokens"]
        times = np.array(row["token_times"])
        assert len(times) == row["output_tokens"] and np.all(np.diff(times) > 0)
        assert row["ttft_s"] == pytest.approx(times[0], rel=1e-6)
        assert row["e2e_s"] == pytest.approx(times[-1], rel=1e-6)
        assert row["ttft_s"] > 0.004  # at least one calibrated step


def test_simulated_rows_carry_the_traces_tenant(tmp_path: Path) -> None:
    trace = REPO / "traces/burstgpt-1-first400.parquet"
    out = tmp_path / "baseline-r0.parquet"
    done = replaybench("simulate", str(trace), "-o", str(out), "--arm", "baseline")
    assert done.returncode == 0, done.stderr
    tenants = {r["request_id"]: r["tenant"] for r in Trace.read(trace).table.to_pylist()}
    assert set(tenants.values()) == {"Conversation log", "API log"}  # BurstGPT's log types
    rows = read_results(out)[0].to_pylist()
    assert len(rows) == 400 and all(row["tenant"] == tenants[row["request_id"]] for row in rows)


def test_simulate_rejects_a_missing_trace_with_one_line(tmp_path: Path) -> None:
    done = replaybench("simulate", str(tmp_path / "absent.parquet"), "-o", str(tmp_path / "out.parquet"))
    assert done.returncode == 2 and done.stderr.startswith("error:")
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.parquet").exists()


def itl_p50(policy: StatePolicy, trace: Trace) -> float:
    spec = EngineSpec(
        shape=load_model_shape(REPO / "configs/models/nemotron-h-8b.json"),
        gpu=get_gpu("h200"),
        policy=policy,
        factors=load_factors(),
        max_model_len=8192,
    )
    run = simulate_trace(trace, spec, time_scale=0.05)
    gaps = [g for t in run.requests for g in np.diff(run.token_times(t))]
    return float(np.median(gaps))


def test_replayssm_lowers_itl_on_a_compressed_azure_slice(azure_slice: Path) -> None:
    trace = Trace.read(azure_slice)
    assert itl_p50(StatePolicy("replayssm"), trace) < itl_p50(StatePolicy("baseline"), trace)
