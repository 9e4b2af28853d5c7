"""Quality tasks: prompts with an expected outcome, run greedily on both arms after the replays.

Task file: JSONL, one task per line, e.g.
    {"task_id": "sum-1", "prompt": "2+2=", "kind": "numeric", "expected": "4", "tolerance": 0.01}
`kind`: "exact" (whole output, stripped), "contains" (substring), "regex" (re.search), "numeric" (the last
number in the output is within `tolerance` of `expected`). Optional `max_tokens` (default 64).
Cross-arm agreement: identical outputs, and the index of the first token where they differ.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.atomic import atomic_path
from harness.errors import UserError

_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


class QualityTask(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str = Field(min_length=1)
    prompt: str
    kind: Literal["exact", "contains", "regex", "numeric"]
    expected: str
    tolerance: float = Field(default=0.0, ge=0)
    max_tokens: int = Field(default=64, ge=1)

    @model_validator(mode="after")
    def _checkable(self) -> QualityTask:
        if self.kind == "regex":
            try:
                re.compile(self.expected)
            except re.error as error:
                raise ValueError(f"`expected` is not a valid regex ({error})") from None
        if self.kind == "numeric" and not _NUMBER.fullmatch(self.expected.strip()):
            raise ValueError(f"`expected` must be a number for kind numeric (got {self.expected!r})")
        return self

    def passed(self, output: str) -> bool:
        if self.kind == "exact":
            return output.strip() == self.expected.strip()
        if self.kind == "contains":
            return self.expected in output
        if self.kind == "regex":
            return re.search(self.expected, output) is not None
        numbers = _NUMBER.findall(output)
        return bool(numbers) and math.isclose(
            float(numbers[-1]), float(self.expected), rel_tol=0, abs_tol=self.tolerance
        )


def load_tasks(path: Path) -> list[QualityTask]:
    """Read a task file; a bad line is a `UserError` naming the line and the field."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise UserError(f"{path}: cannot read the quality task file ({error.strerror}); fix quality_tasks") from None
    tasks, seen = [], set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            task = QualityTask.model_validate(json.loads(line))
        except json.JSONDecodeError as error:
            raise UserError(f"{path}:{number}: not a JSON object ({error.msg}); one task per line") from None
        except ValidationError as error:
            first = error.errors()[0]
            key = ".".join(str(p) for p in first["loc"]) or "(line)"
            raise UserError(f"{path}:{number}: `{key}`: {first['msg']}; fix that task") from None
        if task.task_id in seen:
            raise UserError(f"{path}:{number}: task_id {task.task_id!r} repeats; task ids must be unique")
        seen.add(task.task_id)
        tasks.append(task)
    if not tasks:
        raise UserError(f"{path}: no quality tasks; add at least one line or remove quality_tasks")
    return tasks


def first_divergence(a: list[int] | list[str], b: list[int] | list[str]) -> int | None:
    """Index of the first differing token, or None when the sequences are equal."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


Tokenize = Callable[[str], list[int] | None]
TokenIds = list[int] | None

BY_TOKEN_IDS = "token ids returned by the server"
BY_TEXT = "text"
BY_TOKENIZE = "server /tokenize"
BY_WORDS = "whitespace (server has no /tokenize)"


def compare_answers(
    baseline: str, candidate: str, tokenize: Tokenize, ids: tuple[TokenIds, TokenIds] = (None, None)
) -> tuple[bool, int | None, str]:
    """(identical, first divergent token, what was compared) for one prompt's answers from the two arms.

    Token ids when both arms returned them (vLLM's `return_token_ids`): exact, no re-tokenisation. Otherwise the
    texts, the divergence located in the server's tokens, or in whitespace words without a /tokenize."""
    if ids[0] is not None and ids[1] is not None:
        divergent = first_divergence(ids[0], ids[1])
        return divergent is None, divergent, BY_TOKEN_IDS
    if baseline == candidate:
        return True, None, BY_TEXT
    tokens = [tokenize(baseline), tokenize(candidate)]
    if tokens[0] is None or tokens[1] is None:
        return False, first_divergence(baseline.split(), candidate.split()), BY_WORDS
    return False, first_divergence(tokens[0], tokens[1]), BY_TOKENIZE


def compare_outputs(
    tasks: list[QualityTask], outputs: dict[str, list[str]], tokenize: Tokenize, target: Path
) -> dict[str, object]:
    """Score both arms' outputs (in task order) and compare them; write quality.json atomically and return it."""
    records = []
    tokenizer = BY_TOKENIZE
    for index, task in enumerate(tasks):
        texts = {arm: outputs[arm][index] for arm in ("baseline", "candidate")}
        identical, divergent, compared = compare_answers(texts["baseline"], texts["candidate"], tokenize)
        if compared == BY_WORDS:
            tokenizer = BY_WORDS
        records.append(
            {
                "task_id": task.task_id,
                "kind": task.kind,
                **{arm: {"passed": task.passed(text), "output": text} for arm, text in texts.items()},
                "identical": identical,
                "first_divergent_token": divergent,
            }
        )
    document = {"tokenizer": tokenizer, "tasks": records}
    write_json(target, document)
    return document


def write_json(target: Path, document: object) -> None:
    """Write a result document atomically (a reader never sees half a file)."""
    with atomic_path(target) as tmp:
        tmp.write_text(json.dumps(document, indent=2) + "\n")
