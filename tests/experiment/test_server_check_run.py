"""`replaybench run` on the embedded engine: summary.json holds the server's own means, and they agree with
the client's (the engine stamps its histograms from its true step deadlines, as vLLM's engine core does)."""

from __future__ import annotations

import re

import pytest

from harness.analysis.model import Summary
from tests.experiment.support import config_dict, tiny_trace, write_config
from tests.experiment.test_cli import only_run_dir, replaybench

OUTPUT_TOKENS = 48  # long enough that one late socket write moves a request's TPOT by well under 1 %
REQUESTS = 6


@pytest.mark.timing
def test_run_summary_holds_server_means_that_agree_with_the_client(tmp_path) -> None:
    trace = tiny_trace(tmp_path / "trace.parquet", requests=REQUESTS, spacing_s=0.05, output_tokens=OUTPUT_TOKENS)
    document = config_dict(trace, repeats=2, restart_per_repeat=False)
    result = replaybench(
        "run", "--config", str(write_config(tmp_path / "exp.toml", document)), "--output-dir", str(tmp_path / "out")
    )
    assert result.returncode == 0, result.stderr
    run = only_run_dir(tmp_path / "out")
    summary = Summary.model_validate_json((run / "summary.json").read_text())
    assert len(summary.runs) == 4
    for row in summary.runs:
        check = row.server_check
        assert check.missing == [] and check.notes == [], (row.arm, row.repeat)
        # the warm-up request came before the first scrape: the server counted exactly the replay
        assert check.server["requests"] == check.client["requests"] == REQUESTS
        assert check.server["generated_tokens"] == check.client["generated_tokens"] == REQUESTS * OUTPUT_TOKENS
        assert check.server["prompt_tokens"] == check.client["prompt_tokens"] == REQUESTS * 32
        assert check.server["preemptions"] == 0
        for name in ("ttft_mean_s", "e2e_mean_s"):  # the client's clock starts before and stops after the server's
            assert 0 < check.server[name] <= check.client[name], name
        assert check.slow_side is None and row.warnings == [], check.warning
        assert check.tpot_ratio == pytest.approx(1.0, abs=0.05)
        assert check.server["itl_mean_s"] == pytest.approx(check.client["itl_mean_s"], rel=0.05)
    for arm in ("baseline", "candidate"):
        means = summary.server_check[arm]
        assert means.runs == 2 and means.flagged == 0
        assert means.server["tpot_mean_s"] == pytest.approx(means.client["tpot_mean_s"], rel=0.05)
    markdown = (run / "summary.md").read_text()
    assert "Server cross-check, mean TPOT client / server: baseline " in markdown
    # what the machine did during each run (experiment/telemetry.py): the host always, GPUs where nvidia-smi is
    for row in summary.runs:
        assert row.conditions is not None and row.conditions.samples >= 1, (row.arm, row.repeat)
        assert 0 <= row.conditions.cpu_busy_mean_pct <= 100
        assert (run / "telemetry" / f"{row.arm}-r{row.repeat}.json").exists()
    assert "Machine during the runs (1-s samples, 4 runs): host CPU busy " in markdown
    html = (run / "index.html").read_text()
    assert "host CPU busy / steal max" in html
    # each run's X-Request-Id prefix, to find its requests in the server's log, distinct per run
    prefixes = [row.request_id_prefix for row in summary.runs]
    assert all(re.fullmatch(rf"rb-{r.arm}-r{r.repeat}-[0-9a-f]{{8}}-", r.request_id_prefix) for r in summary.runs)
    assert len(set(prefixes)) == 4 and all(f"<code>{p}</code>" in html for p in prefixes)
