"""engine_pair: the two arms' decode windows interleaved in pairs, the ratio and its interval over pairs, and the
refusals before any engine starts (here, without vLLM)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from replayssm_patch.gpu.engine_pair import main, pair_order, pair_row, parser, ratio_interval, row_line

CONFIG = Path(__file__).parents[3] / "configs" / "models" / "nemotron-h-8b.json"


def _args(tmp_path: Path, *extra: str):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(CONFIG.read_text())
    return parser().parse_args(["--model", str(model), "--candidate", "replayssm_split", "--out",
                                str(tmp_path / "pairs.json"), *extra])  # fmt: skip


def test_the_arms_take_turns_going_first():
    assert [pair_order(n) for n in range(4)] == [("baseline", "candidate"), ("candidate", "baseline")] * 2


def test_a_host_phase_that_slows_both_arms_of_a_pair_leaves_the_ratio_alone():
    """Session 34's host ran ~30 % slower for minutes at a time: in pairs seconds apart both arms carry it, so the
    ratio (1.5 in every pair) and its interval do not move; the arms' own spreads do."""
    phase = np.array([1.0, 1.0, 1.3, 1.3, 1.0, 1.3])
    ratio, low, high = ratio_interval(22.0 * phase, 22.0 / 1.5 * phase)
    assert ratio == pytest.approx(1.5) and low == pytest.approx(1.5) and high == pytest.approx(1.5)


def test_the_interval_is_a_t_interval_of_the_pairs_log_ratios():
    baseline, candidate = [22.0, 22.5, 21.8, 23.1], [15.0, 15.6, 14.9, 14.7]
    logs = np.log(np.array(baseline) / np.array(candidate))
    half = 3.182446305284263 * logs.std(ddof=1) / math.sqrt(4)  # t(0.975, 3)
    ratio, low, high = ratio_interval(baseline, candidate)
    assert ratio == pytest.approx(math.exp(logs.mean()))
    assert (low, high) == pytest.approx((math.exp(logs.mean() - half), math.exp(logs.mean() + half)))
    assert ratio_interval([22.0], [15.0]) is None


def _checks(*problems: str) -> dict:
    return {"exact": True, "preemptions": 0, "valid": not problems, "problems": list(problems)}


def test_a_row_keeps_every_pair_and_says_what_made_it_invalid(tmp_path):
    args = _args(tmp_path)
    pairs = [{"order": "AB", "baseline_ms": 22.0, "candidate_ms": 14.8},
             {"order": "BA", "baseline_ms": 22.4, "candidate_ms": None},  # no window: left out of the ratio
             {"order": "AB", "baseline_ms": 21.8, "candidate_ms": 14.6}]  # fmt: skip
    row = pair_row(args, 256, pairs, {"baseline": _checks(), "replayssm_split": _checks("2 preemptions: raise it")})
    assert row["variant"] == "replayssm_split" and row["batch"] == 256 and len(row["pairs"]) == 3
    assert row["ratio"] == pytest.approx(math.sqrt(22.0 / 14.8 * 21.8 / 14.6), abs=1e-4)
    assert (row["baseline_window_ms"], row["candidate_window_ms"]) == (21.9, 14.7)
    assert row["valid"] is False and row["problems"] == ["replayssm_split: 2 preemptions: raise it"]
    assert row["checks"]["replayssm_split"] == {"exact": True, "preemptions": 0}
    assert row_line(row).startswith("replayssm_split vs baseline O0 B=256: 1.490x (95% CI 1.448-1.533x) over 2 pairs")
    row["max_concurrency"] = {"baseline": 397.0, "replayssm_split": 254.0}  # what main adds from the engines
    assert "; load 101% / 64% of each engine's maximum concurrency INVALID: " in row_line(row)
    lone = pair_row(args, 64, pairs[:2], {"baseline": _checks(), "replayssm_split": _checks()})
    assert lone["ratio"] is None and lone["problems"] == ["1 pair(s) with both decode windows: no interval; run the "
                                                          "batch again"]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--pairs", "1"], "--pairs must be at least 2"),
        (["--gpu-memory-utilization", "0.85"], "two must fit: give at most 0.47"),
        (["--batches", "fit"], "as numbers for a pair of engines"),
        (["--batches", "512"], "--max-num-seqs"),
    ],
)
def test_bad_settings_are_one_line_before_any_engine_starts(tmp_path, capsys, extra, needle):
    args = _args(tmp_path)
    assert main(["--model", str(args.model), "--candidate", "replayssm_fp32", "--out", str(args.out), *extra]) == 2
    out = capsys.readouterr().out.strip()
    assert out.startswith("error: ") and "\n" not in out and needle in out
