"""pair_summary: the paired rows' ratios with their intervals against issue 15's targets, read from the file."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from replayssm_patch.gpu import pair_summary
from replayssm_patch.gpu.engine_pair import WHAT, pair_row
from replayssm_patch.gpu.row_file import record_row

CLEAN = {"exact": True, "preemptions": 0, "valid": True, "problems": []}


def _row(candidate: str, batch: int, baseline_ms: list[float], candidate_ms: list[float]) -> dict:
    args = argparse.Namespace(candidate=candidate, mode="default", prompt_tokens=1024)
    pairs = [{"order": "AB" if n % 2 == 0 else "BA", "baseline_ms": b, "candidate_ms": c}
             for n, (b, c) in enumerate(zip(baseline_ms, candidate_ms, strict=True))]  # fmt: skip
    row = pair_row(args, batch, pairs, {"baseline": CLEAN, candidate: CLEAN})
    return row | {"max_concurrency": {"baseline": 397.0, candidate: 254.0}, "conditions": {"gpu_sm_mhz_mean": 1650.0}}


def _file(tmp_path: Path, *rows: dict) -> Path:
    path = tmp_path / "engine_pair-h200.json"
    for row in rows:
        record_row(path, row, WHAT, "python3 -m replayssm_patch.gpu.engine_pair ...", {"gpu": "NVIDIA H200"})
    return path


def _lines(out: str) -> dict[tuple[int, str], str]:
    table = [line for line in out.splitlines() if line.startswith("| default |")]
    return {(int(line.split(" | ")[1]), line.split(" | ")[2]): line for line in table}


def test_each_target_is_read_against_the_ratio_and_its_whole_interval(tmp_path, capsys):
    split = _row("replayssm_split", 256, [22.0, 22.4, 21.8, 22.2], [14.2, 14.5, 14.1, 14.4])  # ~1.55x, tight
    fp32 = _row("replayssm_fp32", 256, [22.0, 22.4, 21.8, 22.2], [17.8, 16.6, 17.9, 16.5])  # ~1.29x, wide
    small = _row("replayssm_fp32", 64, [8.6, 8.6, 8.7, 8.5], [7.4, 7.3, 7.4, 7.4])
    assert pair_summary.main([str(_file(tmp_path, split, fp32, small))]) == 0
    lines = _lines(capsys.readouterr().out)
    assert lines[(256, "replayssm_split")].endswith("| ≥ 1.50×: met, the whole interval above |")
    assert "| 4 | 14.3 / 22.1 | 1.55× | " in lines[(256, "replayssm_split")]
    assert "| 101% / 64% | 1,650 |" in lines[(256, "replayssm_split")]
    assert lines[(256, "replayssm_fp32")].endswith("| ≥ 1.30×: NOT met, the interval reaches above |")
    assert lines[(64, "replayssm_fp32")].endswith("| ≥ 0.98×: met, the whole interval above |")


def test_a_row_without_an_interval_is_left_out_with_its_reason(tmp_path, capsys):
    lone = _row("replayssm_split", 256, [22.0], [14.2])
    assert pair_summary.main([str(_file(tmp_path, lone))]) == 0
    out = capsys.readouterr().out
    assert _lines(out) == {}
    assert "- replayssm_split default, batch 256: 1 pair(s) with both decode windows: no interval" in out


@pytest.mark.parametrize(
    ("make_args", "needle"),
    [(lambda tmp: [], "give one engine_pair results file"), (lambda tmp: [str(tmp / "none.json")], "does not exist")],
)
def test_bad_input_is_one_error_line(tmp_path, capsys, make_args, needle):
    assert pair_summary.main(make_args(tmp_path)) == 2
    out = capsys.readouterr().out.strip()
    assert out.startswith("error: ") and needle in out and "\n" not in out
