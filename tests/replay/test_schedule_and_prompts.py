"""The absolute schedule and deterministic prompt synthesis, without a server."""

from __future__ import annotations

import asyncio
import time

from harness.replay.prompts import VOCABULARY, prompt_words
from harness.replay.schedule import shard, wait_until


def test_wait_until_never_returns_early() -> None:
    async def run() -> list[float]:
        t0 = time.monotonic()
        deadlines = [t0 + d for d in (0.0, 0.0005, 0.003, 0.02)]
        early = []
        for deadline in deadlines:
            await wait_until(deadline)
            early.append(deadline - time.monotonic())
        return early

    assert all(e <= 0 for e in asyncio.run(run()))


def test_shards_are_round_robin_and_cover_everything() -> None:
    parts = [list(shard(10, 3, k)) for k in range(3)]
    assert parts == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert sorted(i for part in parts for i in part) == list(range(10))


def test_prompt_words_are_deterministic_and_exact() -> None:
    a = prompt_words(1, "r1", [10, 11], 5, 13)
    assert a == prompt_words(1, "r1", [10, 11], 5, 13) and len(a) == 13 and set(a) <= set(VOCABULARY)
    assert prompt_words(2, "r1", [10, 11], 5, 13) != a  # the seed matters
    b = prompt_words(1, "r2", [10, 12], 5, 13)
    assert b[:5] == a[:5] and b[5:10] != a[5:10]  # shared first block only
    assert prompt_words(1, "r1", [10, 11], 5, 7) == a[:7]  # shorter prompts are prefixes: fitting is stable
    assert prompt_words(1, "r3", [], 5, 0) == []
