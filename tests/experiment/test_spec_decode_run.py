"""A speculative-decoding A/B on the embedded engine, end to end: `replaybench run` with both arms drafting.

Equal acceptance: the gate passes and a verdict is computed; the report shows the AL configured and measured
per run and the throughput-vs-AL plot; TPOT counted from tokens agrees with the server's although each chunk
carries several tokens. Different acceptance: INVALID, naming both measured lengths."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.analysis.model import Outcome, Summary
from harness.records.result_io import read_results
from tests.experiment.support import config_dict, sim_command, tiny_trace, write_config
from tests.experiment.test_cli import only_run_dir, replaybench

OUTPUT_TOKENS = 48
REQUESTS = 6


def _run(tmp_path: Path, baseline_al: str, candidate_al: str) -> Path:
    trace = tiny_trace(tmp_path / "trace.parquet", requests=REQUESTS, spacing_s=0.05, output_tokens=OUTPUT_TOKENS)
    spec = ("--spec-tokens", "3", "--acceptance-length")
    arms = {
        arm: {"command": sim_command(policy, *spec, al), "startup_timeout_s": 60, "stop_grace_s": 5}
        for arm, policy, al in (("baseline", "baseline", baseline_al), ("candidate", "replayssm", candidate_al))
    }
    document = config_dict(trace, repeats=2, restart_per_repeat=False, arms=arms)
    result = replaybench(
        "run", "--config", str(write_config(tmp_path / "exp.toml", document)), "--output-dir", str(tmp_path / "out")
    )
    assert result.returncode in (0, 1, 2, 3), result.stderr
    return only_run_dir(tmp_path / "out")


@pytest.mark.timing
def test_equal_acceptance_passes_the_gate_and_the_report_shows_it(tmp_path: Path) -> None:
    run = _run(tmp_path, "3", "3")
    summary = Summary.model_validate_json((run / "summary.json").read_text())
    assert summary.decision.outcome != Outcome.INVALID, summary.decision.reason
    assert summary.acceptance is not None and summary.acceptance.matched is True
    assert summary.acceptance.acceptance_length == {"baseline": 3.0, "candidate": 3.0}
    assert summary.acceptance.configured == {"baseline": 3.0, "candidate": 3.0}
    for row in summary.runs:
        spec = row.spec_decode
        assert spec.configured is not None and spec.configured.acceptance_length == 3.0 and spec.configured.tokens == 3
        assert spec.acceptance_length == 3.0 and spec.acceptance_by_position == [1.0, 1.0, 0.0]
        # each request: one prefill step, then 16 verify steps of 3 tokens (the last cut to 2)
        assert spec.drafts == REQUESTS * 16 and spec.accepted_tokens == REQUESTS * 32
        assert spec.emitted_throughput is not None and spec.processed_throughput is not None
        assert spec.processed_throughput > spec.emitted_throughput  # the rejected third drafts
        # TPOT from token counts (several per chunk) is the server's, not 3x it as chunk counting would give
        assert row.server_check.tpot_ratio == pytest.approx(1.0, abs=0.05)
        assert row.server_check.client["generated_tokens"] == REQUESTS * OUTPUT_TOKENS
    table, _ = read_results(run / "results" / "candidate-r0.parquet")
    counts = table.column("token_counts").to_pylist()
    assert all(c == [1] + [3] * 15 + [2] for c in counts)
    html = (run / "index.html").read_text()
    assert 'id="spec-decode"' in html and 'alt="throughput vs acceptance length"' in html
    assert "synthetic (serve-sim), k=3" in html
    markdown = (run / "summary.md").read_text()
    assert "Speculative decoding: measured acceptance length baseline AL 3.000 vs candidate AL 3.000" in markdown


def test_different_acceptance_is_invalid_naming_both_lengths(tmp_path: Path) -> None:
    run = _run(tmp_path, "3", "2")
    summary = Summary.model_validate_json((run / "summary.json").read_text())
    assert summary.decision.outcome == Outcome.INVALID
    assert "baseline AL 3.000 vs candidate AL 2.000" in summary.decision.reason
    assert "same drafter, k and acceptance" in summary.decision.reason
    assert summary.acceptance is not None and summary.acceptance.matched is False
