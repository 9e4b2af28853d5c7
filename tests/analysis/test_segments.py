"""Segments (analysis/segments.py): the request-paired comparison within prompt- and output-length terciles finds an
effect confined to the longest prompts, BH-corrected, and shows it in summary.json, summary.md and the report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.analysis.analyse import analyse_run_dir
from harness.analysis.model import Summary
from harness.report.build import build_report
from tests.support.synthetic_results import Scenario, write_run_dir

CONFIG = {"decision": {"target": {"metric": "tpot_p50", "margin": 0.05}, "exploratory": ["ttft_p50"]}}


def segment(summary: Summary, label_start: str, metric: str):
    return next(g for g in summary.segments if g.segment.startswith(label_start) and g.metric == metric)


def test_an_effect_on_long_prompts_only_is_found_in_their_segment(tmp_path: Path) -> None:
    scenario = Scenario(config=CONFIG, repeats=4, requests=900, long_prompt_ttft_factor=1.5, seed=3)
    run = write_run_dir(tmp_path, scenario)
    build_report(run.root)
    summary = Summary.model_validate_json(run.summary_json.read_text())
    labels = [g.segment for g in summary.segments if g.metric == "ttft_p50" and g.dimension == "prompt"]
    patterns = (r"prompt ≤ [\d,]+ tokens", r"prompt [\d,]+-[\d,]+ tokens", r"prompt > [\d,]+ tokens")
    assert len(labels) == 3 and all(re.fullmatch(p, label) for p, label in zip(patterns, labels, strict=True))
    long = segment(summary, "prompt >", "ttft_p50")
    assert long.ratio == pytest.approx(1.5, rel=0.05) and long.q_value < 0.01 and 250 <= long.requests <= 300
    for label in ("prompt ≤", "output ≤", "output >"):
        assert segment(summary, label, "tpot_p50").ratio == pytest.approx(1.0, abs=0.02)  # no TPOT effect anywhere
    short = segment(summary, "prompt ≤", "ttft_p50")
    assert short.ratio == pytest.approx(1.0, abs=0.03) and short.q_value > 0.05
    whole = next(c for c in summary.comparisons if c.metric == "ttft_p50")
    assert 1.0 < whole.ratio < 1.2  # the median request's change is smaller: the segment says where it is
    assert len(summary.segments) == 12  # 2 dimensions x 3 terciles x 2 metrics
    comment = run.summary_md.read_text()
    assert "By request size (exploratory, 12 segment comparisons, BH): ttft_p50 +" in comment
    assert "for prompt >" in comment and "for prompt ≤" not in comment
    assert 'id="segments"' in run.index_html.read_text()


def test_no_segments_below_two_repeat_pairs_and_small_segments_are_left_out(tmp_path: Path) -> None:
    one = write_run_dir(tmp_path / "one", Scenario(config=CONFIG, repeats=1, requests=300, seed=4))
    assert analyse_run_dir(one.root).summary.segments == []
    small = write_run_dir(tmp_path / "small", Scenario(config=CONFIG, repeats=2, requests=45, seed=5))
    assert analyse_run_dir(small.root).summary.segments == []  # ~15 requests a tercile: under MIN_REQUESTS
    # no effect anywhere: BH keeps the chance of any finding near 5 % (1 of 40 seeds at 5 repeats, 3 of 40 at 3)
    quiet = write_run_dir(tmp_path / "quiet", Scenario(config=CONFIG, repeats=5, requests=600, seed=6))
    build_report(quiet.root)
    summary = json.loads(quiet.summary_json.read_text())
    assert len(summary["segments"]) == 12 and all(g["q_value"] > 0.05 for g in summary["segments"])
    assert "no segment's change is a finding (q ≥ 0.05)" in quiet.summary_md.read_text()
