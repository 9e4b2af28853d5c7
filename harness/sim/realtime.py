"""Run an `EngineCore` in real time on asyncio: each step ends at an absolute deadline on the monotonic clock.

While the engine stays busy, step k+1 starts at step k's deadline (not when the loop happened to wake), so
wake-up errors never accumulate. The loop sleeps coarsely, then yields in a tight loop for the last
`SPIN_S`, and records how late it woke for every step: that lateness is the engine's own timing error.
"""

from __future__ import annotations

import asyncio
import time
from typing import NamedTuple

from harness.sim.engine_core import EngineCore
from harness.sim.metrics import EngineMetrics
from harness.sim.scheduler import Sequence

# asyncio timers ride on epoll's 1 ms granularity and wake up to ~1.2 ms late; with a 1 ms spin ~10 % of steps
# were > 1 ms late on a quiet 16-core host, with 2 ms under 0.5 % (bench_sim). Spinning yields to other tasks.
SPIN_S = 0.002


class TokenTick(NamedTuple):
    """Tokens produced so far for one sequence, and the deadline of the step that produced the last one."""

    produced: int
    deadline: float


class RealtimeEngine:
    def __init__(self, core: EngineCore, metrics: EngineMetrics) -> None:
        self.core, self.metrics = core, metrics
        self._streams: dict[Sequence, asyncio.Queue[TokenTick]] = {}
        self._wake = asyncio.Event()

    def submit(
        self, request_id: str, prompt_tokens: int, output_tokens: int
    ) -> tuple[Sequence, asyncio.Queue[TokenTick]]:
        """Enqueue a request; its queue gets a `TokenTick` after every step that emits one of its tokens."""
        seq = self.core.new_sequence(request_id, prompt_tokens, output_tokens)
        queue: asyncio.Queue[TokenTick] = asyncio.Queue()
        self._streams[seq] = queue
        self.metrics.prompt_tokens += prompt_tokens
        self.metrics.latencies.arrived(request_id, time.monotonic())
        self._wake.set()
        return seq, queue

    def abort(self, seq: Sequence) -> None:
        """The client went away (or a stall was injected): stop computing for it."""
        if self._streams.pop(seq, None) is not None and not seq.finished:
            self.core.scheduler.abort(seq)
            self.metrics.latencies.dropped(seq.request_id)

    async def run(self) -> None:
        deadline: float | None = None
        while True:
            if not self.core.scheduler.has_work():
                deadline = None
                self._wake.clear()
                await self._wake.wait()
            start = deadline if deadline is not None else time.monotonic()
            result = self.core.step()
            if result is None:  # everything left was aborted
                deadline = None
                await asyncio.sleep(0)
                continue
            deadline = start + result.duration_s
            await sleep_until(deadline)
            self.metrics.lateness.observe(time.monotonic() - deadline)
            self.metrics.observe_step(result)
            for seq, _ in result.emitted:
                self.metrics.latencies.emitted(seq.request_id, deadline)
                queue = self._streams.get(seq)
                if queue is not None:
                    queue.put_nowait(TokenTick(seq.output_count, deadline))
            for seq in result.finished:
                self.metrics.latencies.finished(seq.request_id, seq.output_count)
                self._streams.pop(seq, None)


async def sleep_until(deadline: float) -> None:
    remaining = deadline - time.monotonic()
    if remaining > SPIN_S:
        await asyncio.sleep(remaining - SPIN_S)
    while time.monotonic() < deadline:
        await asyncio.sleep(0)
