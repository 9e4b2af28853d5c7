"""Quality task scoring and agreement, and the per-repeat arm order policies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import UserError
from harness.experiment.ordering import arm_order
from harness.experiment.quality import QualityTask, compare_outputs, first_divergence, load_tasks


def task(kind: str, expected: str, **extra: object) -> QualityTask:
    return QualityTask(task_id="t", prompt="p", kind=kind, expected=expected, **extra)  # type: ignore[arg-type]


def test_each_kind_passes_and_fails() -> None:
    assert task("exact", "Paris").passed("  Paris\n") and not task("exact", "Paris").passed("Paris.")
    assert task("contains", "blue").passed("the sky is blue") and not task("contains", "blue").passed("Blue")
    assert task("regex", r"^\d{3}$").passed("123") and not task("regex", r"^\d{3}$").passed("1234")
    numeric = task("numeric", "3.14", tolerance=0.01)
    assert numeric.passed("pi is about 3.141") and not numeric.passed("pi is 3.2") and not numeric.passed("none")
    assert task("numeric", "-2e3").passed("x = 5, y = -2000")  # the last number counts


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_compare_outputs_writes_quality_json(tmp_path: Path) -> None:
    tasks = [task("contains", "a"), QualityTask(task_id="u", prompt="q", kind="exact", expected="x y z")]
    document = compare_outputs(
        tasks,
        {"baseline": ["a b", "x y z"], "candidate": ["a b", "x q z"]},
        lambda text: None,
        tmp_path / "quality.json",
    )
    assert json.loads((tmp_path / "quality.json").read_text()) == document
    first, second = document["tasks"]  # type: ignore[misc]
    assert first["identical"] and first["first_divergent_token"] is None and first["candidate"]["passed"]
    assert not second["identical"] and second["first_divergent_token"] == 1
    assert second["baseline"] == {"passed": True, "output": "x y z"} and not second["candidate"]["passed"]
    assert document["tokenizer"].startswith("whitespace")


def test_bad_task_lines_are_named(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"task_id": "a", "prompt": "p", "kind": "exact", "expected": "x"}\n{"task_id": "b"}\n')
    with pytest.raises(UserError, match=r"tasks\.jsonl:2: `prompt`: Field required; fix that task"):
        load_tasks(path)
    path.write_text('{"task_id": "a", "prompt": "p", "kind": "numeric", "expected": "four"}\n')
    with pytest.raises(UserError, match=r"tasks\.jsonl:1: .*must be a number for kind numeric"):
        load_tasks(path)
    path.write_text("not json\n")
    with pytest.raises(UserError, match=r"tasks\.jsonl:1: not a JSON object"):
        load_tasks(path)


def test_arm_orders() -> None:
    assert [arm_order("abba", k, 0)[0] for k in range(4)] == ["baseline", "candidate", "baseline", "candidate"]
    assert arm_order("simultaneous", 3, 0) == ("baseline", "candidate")
    firsts = [arm_order("random", k, 7)[0] for k in range(40)]
    assert firsts == [arm_order("random", k, 7)[0] for k in range(40)]  # reproducible from the seed (resume)
    assert 5 < firsts.count("baseline") < 35 and firsts != [arm_order("random", k, 8)[0] for k in range(40)]
