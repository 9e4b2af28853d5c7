"""Quality task results (quality.json) and the configured limits on them."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from harness.analysis.model import QualitySummary, QualityTask
from harness.records.decision_config import QualityLimits


class _ArmOutcome(BaseModel):
    model_config = ConfigDict(extra="ignore")
    passed: bool | None = None
    output: str | None = None


class _TaskRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")
    task_id: str
    kind: str = ""
    baseline: _ArmOutcome = _ArmOutcome()
    candidate: _ArmOutcome = _ArmOutcome()
    identical: bool | None = None
    first_divergent_token: int | None = None


class _QualityFile(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tasks: list[_TaskRecord]


def _rate(values: list[bool | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _not_measured(note: str) -> QualitySummary:
    return QualitySummary(
        measured=False,
        tasks=[],
        baseline_pass_rate=None,
        candidate_pass_rate=None,
        identical_fraction=None,
        violations=[],
        note=note,
    )


def summarise_quality(path: Path, limits: QualityLimits) -> QualitySummary:
    """Pass rates, cross-arm agreement and limit violations; a missing or unreadable file is a note, not a crash."""
    if not path.exists():
        note = "no quality.json: quality was not measured" + (
            " (but [quality] required = true)" if limits.required else ""
        )
        return _not_measured(note)
    try:
        records = _QualityFile.model_validate(json.loads(path.read_text(encoding="utf-8"))).tasks
    except (OSError, ValueError, ValidationError) as error:
        first_line = str(error).splitlines()[0]
        return _not_measured(f"quality.json is unreadable ({first_line}); re-run the quality tasks")
    return _summarise(records, limits)


def summarise_document(document: object, limits: QualityLimits) -> QualitySummary:
    """The same for a document of quality.json's shape held in memory (`replaybench agree` scores its own)."""
    return _summarise(_QualityFile.model_validate(document).tasks, limits)


def _summarise(records: list[_TaskRecord], limits: QualityLimits) -> QualitySummary:
    tasks = [
        QualityTask(
            task_id=t.task_id,
            kind=t.kind,
            baseline_passed=t.baseline.passed,
            candidate_passed=t.candidate.passed,
            identical=t.identical,
            first_divergent_token=t.first_divergent_token,
        )
        for t in records
    ]
    base = _rate([t.baseline_passed for t in tasks])
    cand = _rate([t.candidate_passed for t in tasks])
    identical = _rate([t.identical for t in tasks])
    violations = []
    if base is not None and cand is not None and base - cand > limits.max_pass_rate_drop + 1e-12:
        violations.append(
            f"candidate pass rate {cand:.1%} is {base - cand:.1%} below baseline {base:.1%} "
            f"(allowed drop {limits.max_pass_rate_drop:.1%})"
        )
    if limits.min_identical_fraction > 0 and (identical or 0.0) < limits.min_identical_fraction:
        violations.append(
            f"only {identical or 0.0:.1%} of tasks have identical outputs "
            f"(required {limits.min_identical_fraction:.1%})"
        )
    return QualitySummary(
        measured=True,
        tasks=tasks,
        baseline_pass_rate=base,
        candidate_pass_rate=cand,
        identical_fraction=identical,
        violations=violations,
    )
