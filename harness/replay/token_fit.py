"""Fit a synthetic prompt to exactly `prompt_tokens` tokens of the server's tokenizer via POST /tokenize.

We calibrate once per API shape (the fixed overhead of an empty prompt or chat template, and tokens per
word over a long text), guess the word count, then correct with the measured count a few times. Tokenizers
can merge words, so an exact fit is not always possible; we keep the closest and the run records the
server's own count (`prompt_tokens_server`) from `usage`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

CALIBRATION_WORDS = 1000
MAX_ROUNDS = 6

CountWords = Callable[[int], Awaitable[int]]  # word count -> server tokens of the prompt built from that many words


@dataclass(frozen=True)
class Calibration:
    overhead: int  # tokens of an empty prompt (BOS, chat template)
    tokens_per_word: float


class ServerTokenizer:
    """Counts tokens of a prompt (`{"prompt": ...}` or `{"messages": [...]}`) with the server's /tokenize."""

    def __init__(self, session: aiohttp.ClientSession, url: str, model: str | None) -> None:
        self.session = session
        self.url = url
        self.model = model

    async def count(self, content: dict[str, Any]) -> int:
        body = ({"model": self.model} if self.model else {}) | content
        async with self.session.post(f"{self.url}/tokenize", json=body) as response:
            response.raise_for_status()
            answer = await response.json(content_type=None)
        return int(answer["count"]) if "count" in answer else len(answer["tokens"])


async def calibrate(count: CountWords) -> Calibration:
    overhead = await count(0)
    many = await count(CALIBRATION_WORDS)
    return Calibration(overhead=overhead, tokens_per_word=max((many - overhead) / CALIBRATION_WORDS, 0.1))


async def fit_word_count(count: CountWords, target: int, calibration: Calibration) -> int:
    """The word count (at least 1: servers reject empty prompts) whose prompt is exactly, or else closest to,
    `target` server tokens."""
    words = max(1, round((target - calibration.overhead) / calibration.tokens_per_word))
    seen: dict[int, int] = {}
    for _ in range(MAX_ROUNDS):
        seen[words] = tokens = await count(words)
        if tokens == target:
            return words
        step = round((target - tokens) / calibration.tokens_per_word) or (1 if target > tokens else -1)
        words = max(1, words + step)
        if words in seen:
            break
    return min(seen, key=lambda n: (abs(seen[n] - target), n))
