"""Which arm goes first in each repeat, so slow drift (thermal, neighbours, caches) cancels in the pairs."""

from __future__ import annotations

import random

ARMS = ("baseline", "candidate")


def arm_order(order: str, repeat: int, seed: int) -> tuple[str, ...]:
    """Arms in the order they run in `repeat`. "simultaneous" returns both; the runner starts them together.

    "abba": baseline first in even repeats, candidate first in odd ones (A B, B A, A B, ...).
    "random": a fair coin per repeat from `seed`, the same for a resumed run.
    """
    if order == "abba":
        return ARMS if repeat % 2 == 0 else ARMS[::-1]
    if order == "random":
        return ARMS if random.Random(f"{seed}:{repeat}").random() < 0.5 else ARMS[::-1]
    return ARMS
