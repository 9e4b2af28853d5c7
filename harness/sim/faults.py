"""Fault injection for reliability tests: HTTP 500s, stalled streams, a hard crash, a slow start."""

from __future__ import annotations

import os
import random
import sys
import time
from dataclasses import dataclass

from harness.errors import UserError

CRASH_EXIT_CODE = 70


@dataclass(frozen=True)
class FaultConfig:
    fail_rate: float = 0.0  # fraction of generation requests answered with HTTP 500
    stall_after_tokens: int | None = None  # every stream stops (connection kept open) after N tokens
    crash_after_requests: int | None = None  # the process exits hard when request N+1 arrives
    startup_delay_s: float = 0.0  # every endpoint answers 503 until this long after start

    def __post_init__(self) -> None:
        if not 0.0 <= self.fail_rate <= 1.0:
            raise UserError(f"--fail-rate must be between 0 and 1 (got {self.fail_rate}); 0.01 fails 1 % of requests")
        if self.stall_after_tokens is not None and self.stall_after_tokens < 0:
            raise UserError(f"--stall-after-tokens must be >= 0 (got {self.stall_after_tokens})")
        if self.crash_after_requests is not None and self.crash_after_requests < 0:
            raise UserError(f"--crash-after-requests must be >= 0 (got {self.crash_after_requests})")
        if self.startup_delay_s < 0:
            raise UserError(f"--startup-delay must be >= 0 seconds (got {self.startup_delay_s})")

    def describe(self) -> str:
        parts = [
            f"fail-rate={self.fail_rate}" if self.fail_rate else "",
            f"stall-after-tokens={self.stall_after_tokens}" if self.stall_after_tokens is not None else "",
            f"crash-after-requests={self.crash_after_requests}" if self.crash_after_requests is not None else "",
            f"startup-delay={self.startup_delay_s}s" if self.startup_delay_s else "",
        ]
        return ", ".join(p for p in parts if p) or "none"


class FaultInjector:
    """Decides, per request, which injected fault applies; seeded so a run is repeatable."""

    def __init__(self, config: FaultConfig, seed: int) -> None:
        self.config = config
        self._rng = random.Random(seed)
        self._ready_at = time.monotonic() + config.startup_delay_s
        self._requests = 0

    def ready(self) -> bool:
        return time.monotonic() >= self._ready_at

    def admit_request(self) -> None:
        """Count a generation request; past --crash-after-requests the process dies without answering."""
        self._requests += 1
        limit = self.config.crash_after_requests
        if limit is not None and self._requests > limit:
            print(
                f"SIMULATED ENGINE: crashing on purpose (--crash-after-requests {limit})", file=sys.stderr, flush=True
            )
            os._exit(CRASH_EXIT_CODE)

    def should_fail(self) -> bool:
        return self.config.fail_rate > 0 and self._rng.random() < self.config.fail_rate

    def stalls_at(self, tokens_sent: int) -> bool:
        limit = self.config.stall_after_tokens
        return limit is not None and tokens_sent >= limit
