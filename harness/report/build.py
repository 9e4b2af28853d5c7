"""Build every report output of a run directory from its files (the paired runner calls this at the end)."""

from __future__ import annotations

from pathlib import Path

from harness.analysis.analyse import RunAnalysis, analyse_run_dir
from harness.analysis.model import Decision
from harness.atomic import atomic_path
from harness.records.run_dir import RunDir
from harness.report.html import render_html
from harness.report.text_outputs import decision_json, junit_xml, summary_json, summary_markdown


def _write(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
        tmp.chmod(0o644)  # reports are meant to be shared; mkstemp creates 0600


def write_outputs(run: RunDir, analysis: RunAnalysis) -> None:
    """Write summary.json, decision.json, summary.md, junit.xml and index.html, each atomically."""
    summary, config = analysis.summary, analysis.config
    _write(run.summary_json, summary_json(summary))
    _write(run.decision_json, decision_json(summary))
    _write(run.summary_md, summary_markdown(summary))
    _write(run.junit_xml, junit_xml(summary))
    _write(run.index_html, render_html(analysis, config.slo, config.decision.lag_budget_s))


def build_report(run_dir: Path) -> Decision:
    """Re-analyse `run_dir` and rewrite all its report files; returns the decision (for the gate / the runner).

    Raises `harness.analysis.inputs.UnusableRunDir` (a `UserError`) when the directory holds no results.
    """
    analysis = analyse_run_dir(run_dir)
    write_outputs(RunDir(Path(run_dir)), analysis)
    return analysis.summary.decision
