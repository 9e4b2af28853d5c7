"""The absolute send schedule: request i is due at t0 + intended_s[i] on time.monotonic(), errors never add up.

asyncio's timer wakes up to ~1 ms late (epoll has millisecond resolution), so we sleep coarsely until
~1 ms before the deadline, then yield to the loop (so in-flight streams keep being read) until ~50 µs
before it, then spin. The blocking spin is kept short: at thousands of requests/s the gaps are a few
hundred µs and a longer spin would starve the streams the loop should be reading. CLOCK_MONOTONIC is
system-wide on Linux, so every worker process shares one t0.
"""

from __future__ import annotations

import asyncio
import time

COARSE_MARGIN_S = 0.001
TIGHT_SPIN_S = 0.00005


async def wait_until(deadline: float) -> None:
    """Return as close as possible after `deadline` (a time.monotonic() value), never before it."""
    remaining = deadline - time.monotonic()
    if remaining > COARSE_MARGIN_S:
        await asyncio.sleep(remaining - COARSE_MARGIN_S)
    while deadline - time.monotonic() > TIGHT_SPIN_S:
        await asyncio.sleep(0)
    while time.monotonic() < deadline:
        pass


def shard(n: int, workers: int, worker: int) -> range:
    """Indices of the requests worker `worker` sends: round-robin, so every worker sees 1/N of the rate."""
    return range(worker, n, workers)
