"""The cost model reproduces the measured vLLM calibration (decode ITL p50 within ±15 %, every concurrency)."""

from __future__ import annotations

import json

import pytest

from harness.sim.calibration import fit_factors, read_calibration, reproduce
from harness.sim.cost_model import DEFAULT_FACTORS_PATH, load_factors
from harness.sim.gpus import get_gpu
from harness.sim.model_config import load_model_shape
from tests.sim.support import REPO

CALIBRATION = REPO / "configs/calibration/h200-vllm-0.24.0-nemotron-h-8b.json"
MODEL = REPO / "configs/models/nemotron-h-8b.json"
TOLERANCE = 0.15


@pytest.fixture(scope="module")
def rows():
    return reproduce(read_calibration(CALIBRATION), load_model_shape(MODEL), get_gpu("h200"), load_factors())


def test_every_calibration_point_is_covered(rows) -> None:
    points = {(r.ssm_dtype, r.concurrency) for r in rows}
    assert points == {(d, c) for d in ("float32", "bfloat16") for c in (1, 16, 64, 128, 256)}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_itl_p50_within_15_percent(rows, dtype: str) -> None:
    for row in (r for r in rows if r.ssm_dtype == dtype):
        assert abs(row.itl_p50_error) <= TOLERANCE, (
            f"{dtype} C={row.concurrency}: modelled {row.modelled.itl_p50_ms:.2f} ms vs "
            f"measured {row.measured.itl_p50_ms:.2f} ms"
        )


def test_fp32_state_is_slower_than_bf16_at_batch_256(rows) -> None:
    itl = {(r.ssm_dtype, r.concurrency): r.modelled.itl_p50_ms for r in rows}
    assert itl[("float32", 256)] > 1.1 * itl[("bfloat16", 256)]


def test_committed_factors_match_a_fresh_fit() -> None:
    """The committed file is what the fit procedure produces today (nobody hand-edited it)."""
    cal = read_calibration(CALIBRATION)
    fresh = fit_factors(cal, load_model_shape(MODEL), get_gpu("h200"))
    committed = json.loads(DEFAULT_FACTORS_PATH.read_text())["factors"]
    for name, value in fresh.to_json().items():
        assert value == pytest.approx(committed[name], rel=0.02, abs=1e-6), name
