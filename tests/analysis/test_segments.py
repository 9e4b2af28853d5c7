"""Segments (analysis/segments.py): the request-paired comparison within prompt- and output-length terciles and the
trace's tenants finds an effect confined to the longest prompts or to one tenant, BH-corrected, and shows it in
summary.json, summary.md and the report."""

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
    assert long.vs_whole > 1.25 and long.q_vs_whole < 0.01  # it fares worse than the run as a whole
    for label in ("prompt ≤", "output ≤", "output >"):
        assert segment(summary, label, "tpot_p50").ratio == pytest.approx(1.0, abs=0.02)  # no TPOT effect anywhere
    short = segment(summary, "prompt ≤", "ttft_p50")
    assert short.ratio == pytest.approx(1.0, abs=0.03) and short.q_value > 0.05
    whole = next(c for c in summary.comparisons if c.metric == "ttft_p50")
    assert 1.0 < whole.ratio < 1.2  # the median request's change is smaller: the segment says where it is
    assert len(summary.segments) == 12  # 2 dimensions x 3 terciles x 2 metrics
    comment = run.summary_md.read_text()
    assert "By request segment (exploratory, 12 segment comparisons, BH): " in comment
    assert "ttft_p50 +5" in comment and "for prompt > " in comment  # +5x %: the long prompts' change
    assert "for output" not in comment  # output length says nothing here: no TTFT or TPOT effect by it
    assert 'id="segments"' in run.index_html.read_text()


def test_no_segments_below_two_repeat_pairs_and_small_segments_are_left_out(tmp_path: Path) -> None:
    one = write_run_dir(tmp_path / "one", Scenario(config=CONFIG, repeats=1, requests=300, seed=4))
    assert analyse_run_dir(one.root).summary.segments == []
    small = write_run_dir(tmp_path / "small", Scenario(config=CONFIG, repeats=2, requests=45, seed=5))
    assert analyse_run_dir(small.root).summary.segments == []  # ~15 requests a tercile: under MIN_REQUESTS
    # an effect everywhere (TPOT -20 %) is a change in every segment, but no segment fares differently from the run
    scenario = Scenario(config=CONFIG, repeats=5, requests=600, itl_factor=0.8, seed=6)
    everywhere = write_run_dir(tmp_path / "all", scenario)
    build_report(everywhere.root)
    summary = json.loads(everywhere.summary_json.read_text())
    tpot = [g for g in summary["segments"] if g["metric"] == "tpot_p50"]
    assert len(summary["segments"]) == 12 and all(g["ratio"] == pytest.approx(0.8, abs=0.03) for g in tpot)
    assert all(g["q_value"] < 0.01 for g in tpot) and all(g["q_vs_whole"] > 0.05 for g in summary["segments"])
    assert "no segment fares differently from the whole run (q ≥ 0.05)" in everywhere.summary_md.read_text()


def test_an_effect_on_one_tenant_only_is_found_in_its_segment(tmp_path: Path) -> None:
    tenants = ("API log", "Conversation log", "batch")
    scenario = Scenario(config=CONFIG, repeats=4, requests=900, tenants=tenants, first_tenant_ttft_factor=1.4, seed=8)
    run = write_run_dir(tmp_path, scenario)
    build_report(run.root)
    summary = Summary.model_validate_json(run.summary_json.read_text())
    by_tenant = [g for g in summary.segments if g.dimension == "tenant"]
    assert sorted({g.segment for g in by_tenant}) == [f"tenant {t}" for t in sorted(tenants)]
    api = segment(summary, "tenant API log", "ttft_p50")
    assert api.ratio == pytest.approx(1.4, rel=0.05) and api.q_vs_whole < 0.01 and 280 <= api.requests <= 300
    for other in ("tenant Conversation log", "tenant batch"):
        assert segment(summary, other, "ttft_p50").vs_whole < 1.0  # the run's median moved; these did not
        assert segment(summary, other, "ttft_p50").ratio == pytest.approx(1.0, abs=0.04)
    assert len(summary.segments) == 18  # 3 dimensions x 3 segments x 2 metrics
    assert "for tenant API log" in run.summary_md.read_text()
    assert "tenant API log" in run.index_html.read_text()


def test_one_tenant_or_none_gives_no_tenant_segments(tmp_path: Path) -> None:
    one = write_run_dir(tmp_path / "one", Scenario(config=CONFIG, repeats=2, requests=300, tenants=("only",), seed=9))
    assert not any(g.dimension == "tenant" for g in analyse_run_dir(one.root).summary.segments)
