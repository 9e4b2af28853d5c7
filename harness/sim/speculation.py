"""Speculative decoding with synthetic acceptance in the simulated engine, as vLLM 0.24 benchmarks it.

vLLM's `rejection_sample_method: "synthetic"` accepts drafts with fixed per-position probabilities whatever
the target says, so the acceptance length (AL: tokens a verify step emits per request, the bonus token
included) is a setting, not a property of the weights. Its `synthetic_acceptance_length` resolves to
*unconditional* per-position rates by the minimum-variance schedule: the first floor(AL - 1) drafts are
always accepted, the next with probability frac(AL - 1), the rest never. The simulated engine uses the same
schedule, so an integer AL accepts exactly AL - 1 drafts every step and a fractional one draws one uniform.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from harness.errors import UserError


@dataclass(frozen=True)
class Speculation:
    """`tokens` drafts (k) verified per decode step; `acceptance_length` in [1, k + 1] emitted on average."""

    tokens: int
    acceptance_length: float

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise UserError(f"--spec-tokens must be at least 1 (got {self.tokens}); vLLM's MTP benchmarks use 3")
        if not 1.0 <= self.acceptance_length <= self.tokens + 1:
            raise UserError(
                f"--acceptance-length must be in [1, {self.tokens + 1}] for --spec-tokens {self.tokens} "
                f"(got {self.acceptance_length:g}): a verify step emits the accepted drafts plus one token"
            )

    @property
    def rates(self) -> list[float]:
        """Unconditional acceptance probability of each draft position (the minimum-variance schedule)."""
        drafts = self.acceptance_length - 1
        full = math.floor(drafts)
        return [1.0 if i < full else drafts - full if i == full else 0.0 for i in range(self.tokens)]

    def accepted(self, rng: random.Random) -> int:
        """Drafts one verify step accepts (0..k): the always-accepted ones plus one Bernoulli draw."""
        drafts = self.acceptance_length - 1
        full = math.floor(drafts)
        return min(full + (rng.random() < drafts - full), self.tokens)

    @property
    def label(self) -> str:
        return f"spec k={self.tokens} AL={self.acceptance_length:g}"


def speculation_of(spec_tokens: int, acceptance_length: float | None) -> Speculation | None:
    """The speculation a command line asks for: none without `--spec-tokens`; AL defaults to k + 1."""
    if not spec_tokens:
        if acceptance_length is not None:
            raise UserError("--acceptance-length needs --spec-tokens K (the drafts verified per step)")
        return None
    return Speculation(spec_tokens, spec_tokens + 1.0 if acceptance_length is None else acceptance_length)
