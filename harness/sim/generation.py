"""Deterministic generated output: which tokens a request produces and how many, from seeds alone.

The same request (same prompt, same `seed` parameter) sent to two servers started with the same `--seed`
gets byte-identical output, so a paired A/B of two simulated arms compares timing only.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from harness.sim.tokenizer import FIRST_WORD_ID

_MASK = (1 << 64) - 1
NATURAL_MIN, NATURAL_SPAN = 16, 32.0  # natural lengths spread log-uniformly over 16..512 tokens


def _mix(value: int) -> int:
    """splitmix64 finaliser: a well-spread 64-bit hash of an integer."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


@dataclass(frozen=True)
class OutputPlan:
    """How many tokens a request will produce, why it stops, and the id of every token."""

    key: int
    length: int
    finish_reason: str  # "length" (hit max_tokens) or "stop" (simulated end of sequence)
    vocab_size: int

    def token_id(self, index: int) -> int:
        return FIRST_WORD_ID + _mix(self.key + index) % (self.vocab_size - FIRST_WORD_ID)


def plan_output(
    server_seed: int,
    request_seed: int | None,
    prompt: str,
    max_tokens: int,
    min_tokens: int,
    ignore_eos: bool,
    vocab_size: int,
) -> OutputPlan:
    """With `ignore_eos` the output is exactly `max_tokens`; otherwise a seeded natural length, clipped."""
    key = _mix(zlib.crc32(prompt.encode()) ^ (server_seed << 32) ^ _mix(request_seed or 0))
    if ignore_eos:
        return OutputPlan(key, max_tokens, "length", vocab_size)
    fraction = (_mix(key ^ 0xE05) >> 11) / float(1 << 53)
    natural = int(NATURAL_MIN * NATURAL_SPAN**fraction)
    length = min(max(natural, min_tokens, 1), max_tokens)
    return OutputPlan(key, length, "length" if length >= max_tokens else "stop", vocab_size)
