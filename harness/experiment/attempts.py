"""attempts.json: every attempt of every arm and repeat, with what became of it. Nothing is dropped silently.

Status: "accepted" (its result is the repeat's result), "crashed" (the server died), "invalid" (replay
fidelity failed), "retried" (abandoned for another reason: the paired arm failed, or an interruption).
A crashed or invalid attempt that used up the last try is still the repeat's result, and says so.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from harness.atomic import atomic_path

Status = Literal["accepted", "retried", "crashed", "invalid"]


@dataclass(frozen=True)
class Attempt:
    arm: str
    repeat: int
    attempt: int
    status: Status
    reason: str
    path: str  # relative to the run directory
    final: bool  # True when this attempt's result is results/<arm>-r<k>.parquet


class AttemptLog:
    """The attempts of one run directory, rewritten atomically after every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.attempts: list[Attempt] = []
        if path.exists():
            self.attempts = [Attempt(**item) for item in json.loads(path.read_text())]

    def next_attempt(self, arm: str, repeat: int) -> int:
        """Attempt numbers keep counting across resumes, so no attempt file is ever overwritten."""
        return 1 + max((a.attempt for a in self.attempts if a.arm == arm and a.repeat == repeat), default=0)

    def add(self, attempt: Attempt) -> None:
        self.attempts.append(attempt)
        self._write()

    def demote(self, repeat: int, reason: str) -> None:
        """Mark every final attempt of a repeat as retried (the repeat is being run again)."""
        self.attempts = [
            Attempt(**(asdict(a) | {"status": "retried", "final": False, "reason": f"{a.reason}; {reason}"}))
            if a.repeat == repeat and a.final
            else a
            for a in self.attempts
        ]
        self._write()

    def complete_repeats(self, arms: tuple[str, ...]) -> set[int]:
        """Repeats where every arm has a final attempt."""
        finals: dict[int, set[str]] = {}
        for a in self.attempts:
            if a.final:
                finals.setdefault(a.repeat, set()).add(a.arm)
        return {repeat for repeat, done in finals.items() if done >= set(arms)}

    def _write(self) -> None:
        with atomic_path(self.path) as tmp:
            tmp.write_text(json.dumps([asdict(a) for a in self.attempts], indent=2) + "\n")
