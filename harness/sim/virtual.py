"""Drive an `EngineCore` in virtual time: no clock, no HTTP; an hour of traffic runs in seconds.

Arrivals come from an open-loop list (a trace) or from a closed loop (C streams that each send the next
request the moment the previous one finishes, as the calibration load did). Every step's emitted tokens are
stamped with the virtual end time of that step (several at once under speculative decoding).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from harness.sim.cost_model import StepWork
from harness.sim.engine_core import EngineCore, RequestRejected
from harness.sim.scheduler import Sequence


@dataclass(frozen=True)
class RequestSpec:
    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    tenant: str | None = None  # the trace's, carried to the result row


@dataclass
class RequestTiming:
    """What happened to one request, in virtual seconds from the start."""

    spec: RequestSpec
    token_steps: list[int] = field(default_factory=list)  # index of each step that emitted tokens
    token_counts: list[int] = field(default_factory=list)  # how many tokens that step emitted (>1: speculation)
    rejected: str | None = None


@dataclass
class VirtualRun:
    requests: list[RequestTiming]
    step_starts: list[float]
    step_durations: list[float]
    step_works: list[StepWork]
    preemptions: int

    def token_times(self, timing: RequestTiming) -> list[float]:
        return [self.step_starts[i] + self.step_durations[i] for i in timing.token_steps]


class ClosedLoop:
    """C streams; each starts a new request (same shape) as soon as its previous one finishes."""

    def __init__(self, concurrency: int, total: int, prompt_tokens: int, output_tokens: int) -> None:
        self.concurrency, self.total = concurrency, total
        self.prompt_tokens, self.output_tokens = prompt_tokens, output_tokens
        self.issued = 0

    def next_request(self, now: float) -> RequestSpec | None:
        if self.issued >= self.total:
            return None
        self.issued += 1
        return RequestSpec(f"closed-{self.issued - 1}", now, self.prompt_tokens, self.output_tokens)

    def initial(self) -> list[RequestSpec]:
        return [r for r in (self.next_request(0.0) for _ in range(self.concurrency)) if r is not None]


def run_virtual(
    core: EngineCore,
    arrivals: Iterable[RequestSpec],
    closed_loop: ClosedLoop | None = None,
    progress: Callable[[int], None] | None = None,
) -> VirtualRun:
    """Run until every request finished; `arrivals` must be sorted. `progress` gets the finished count."""
    pending: list[tuple[float, int, RequestSpec]] = []
    order = 0
    for spec in [*arrivals, *(closed_loop.initial() if closed_loop else [])]:
        heapq.heappush(pending, (spec.arrival_s, order, spec))
        order += 1
    timings: list[RequestTiming] = []
    by_seq: dict[Sequence, RequestTiming] = {}
    starts: list[float] = []
    durations: list[float] = []
    works: list[StepWork] = []
    now = 0.0
    while pending or core.scheduler.has_work():
        if not core.scheduler.has_work() and pending[0][0] > now:
            now = pending[0][0]
        while pending and pending[0][0] <= now:
            spec = heapq.heappop(pending)[2]
            timing = RequestTiming(spec)
            timings.append(timing)
            try:
                seq = core.new_sequence(spec.request_id, spec.prompt_tokens, spec.output_tokens)
            except RequestRejected as rejected:
                timing.rejected = str(rejected)
                if progress:
                    progress(1)
                continue
            by_seq[seq] = timing
        result = core.step()
        if result is None:
            if not pending:
                raise RuntimeError("simulated scheduler stalled with work left")  # a scheduler bug, never input
            now = max(now, pending[0][0])
            continue
        step_index = len(starts)
        starts.append(now)
        durations.append(result.duration_s)
        works.append(result.work)
        now += result.duration_s
        for seq, produced in result.emitted:
            by_seq[seq].token_steps.append(step_index)
            by_seq[seq].token_counts.append(produced)
        if progress and result.finished:
            progress(len(result.finished))
        for seq in result.finished:
            del by_seq[seq]
            follow_up = closed_loop.next_request(now) if closed_loop else None
            if follow_up is not None:
                heapq.heappush(pending, (follow_up.arrival_s, order, follow_up))
                order += 1
    return VirtualRun(
        requests=timings,
        step_starts=starts,
        step_durations=durations,
        step_works=works,
        preemptions=core.scheduler.preemptions,
    )
