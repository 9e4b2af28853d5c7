"""A continuous-batching scheduler modelled on vLLM V1: what each engine step computes.

Per step: running sequences first (decodes and unfinished prefill chunks, in admission order), then waiting
ones FCFS, within a token budget (chunked prefill) and a running-sequence cap. Memory is one pool of bytes:
KV blocks grow with the context, and each admitted sequence holds its SSM state (incl. ReplaySSM's ring and
bf16 copy). When a running sequence cannot grow, the most recently admitted one is preempted (its memory is
freed and it is recomputed from scratch later, as vLLM's recompute preemption does).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from harness.sim.cost_model import StepWork


@dataclass(eq=False)
class Sequence:
    """One request inside the engine. `computed` counts tokens whose KV/state exist."""

    request_id: str
    prompt_tokens: int
    output_target: int
    output_count: int = 0
    computed: int = 0
    blocks: int = 0
    holds_state: bool = False
    preemptions: int = 0
    aborted: bool = False
    finished: bool = False

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.output_count

    @property
    def remaining(self) -> int:
        return self.total_tokens - self.computed


@dataclass
class MemoryPool:
    """KV blocks plus per-sequence recurrent state, drawn from one byte budget."""

    capacity_bytes: int
    block_tokens: int
    block_bytes: int
    state_bytes: int
    used_bytes: int = 0

    def need_bytes(self, seq: Sequence, tokens: int) -> int:
        blocks = math.ceil(tokens / self.block_tokens)
        return max(blocks - seq.blocks, 0) * self.block_bytes + (0 if seq.holds_state else self.state_bytes)

    def fits_alone(self, tokens: int) -> bool:
        """Whether a sequence of `tokens` tokens could ever run (with the pool otherwise empty)."""
        return math.ceil(tokens / self.block_tokens) * self.block_bytes + self.state_bytes <= self.capacity_bytes

    def try_grow(self, seq: Sequence, tokens: int) -> bool:
        need = self.need_bytes(seq, tokens)
        if self.used_bytes + need > self.capacity_bytes:
            return False
        self.used_bytes += need
        seq.blocks = max(seq.blocks, math.ceil(tokens / self.block_tokens))
        seq.holds_state = True
        return True

    def release(self, seq: Sequence) -> None:
        self.used_bytes -= seq.blocks * self.block_bytes + (self.state_bytes if seq.holds_state else 0)
        seq.blocks, seq.holds_state = 0, False

    @property
    def usage(self) -> float:
        return self.used_bytes / self.capacity_bytes if self.capacity_bytes else 1.0


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192


@dataclass
class ScheduledStep:
    chunks: list[tuple[Sequence, int]]
    work: StepWork
    preempted: list[Sequence] = field(default_factory=list)


@dataclass
class StepOutcome:
    """After a step: sequences that produced one more token, and those that are now finished."""

    emitted: list[Sequence]
    finished: list[Sequence]


class Scheduler:
    def __init__(self, limits: SchedulerLimits, pool: MemoryPool) -> None:
        self.limits, self.pool = limits, pool
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        """Mark for removal; memory is freed at the next schedule (a step in flight may still hold it)."""
        seq.aborted = True

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _purge_aborted(self) -> None:
        if any(s.aborted for s in self.waiting):
            self.waiting = deque(s for s in self.waiting if not s.aborted)
        if any(s.aborted for s in self.running):
            for seq in self.running:
                if seq.aborted:
                    self.pool.release(seq)
            self.running = [s for s in self.running if not s.aborted]

    def _preempt_last(self) -> Sequence:
        victim = self.running.pop()
        self.pool.release(victim)
        victim.computed = 0
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def _grow_or_preempt(self, seq: Sequence, tokens: int, preempted: list[Sequence]) -> bool:
        """Make room for `seq` by preempting the latest-admitted sequences; False if `seq` itself was preempted."""
        while not self.pool.try_grow(seq, seq.computed + tokens):
            preempted.append(self._preempt_last())
            if preempted[-1] is seq:
                return False
        return True

    def schedule(self) -> ScheduledStep | None:
        """Choose this step's chunks; None when there is nothing to run."""
        self._purge_aborted()
        budget = self.limits.max_num_batched_tokens
        chunks: list[tuple[Sequence, int]] = []
        preempted: list[Sequence] = []
        for seq in list(self.running):
            if budget == 0 or not seq.holds_state:  # the rest were preempted just now
                break
            tokens = min(seq.remaining, budget)
            if not self._grow_or_preempt(seq, tokens, preempted):
                break
            chunks.append((seq, tokens))
            budget -= tokens
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.limits.max_num_seqs:
            seq = self.waiting[0]
            tokens = min(seq.remaining, budget)
            if not self.pool.try_grow(seq, seq.computed + tokens):
                break
            self.waiting.popleft()
            self.running.append(seq)
            chunks.append((seq, tokens))
            budget -= tokens
        if not chunks:
            return None
        return ScheduledStep(chunks=chunks, work=_work_of(chunks), preempted=preempted)

    def complete(self, step: ScheduledStep) -> StepOutcome:
        """Advance every scheduled sequence by its chunk; a sequence whose context is complete samples a token."""
        emitted: list[Sequence] = []
        finished: list[Sequence] = []
        for seq, tokens in step.chunks:
            if seq.aborted:
                continue
            seq.computed += tokens
            if seq.computed < seq.total_tokens:
                continue
            seq.output_count += 1
            emitted.append(seq)
            if seq.output_count >= seq.output_target:
                seq.finished = True
                finished.append(seq)
                self.pool.release(seq)
        if finished:
            self.running = [s for s in self.running if not s.finished]
        return StepOutcome(emitted=emitted, finished=finished)


def _is_decode(seq: Sequence, tokens: int) -> bool:
    return tokens == 1 and seq.output_count > 0 and seq.computed == seq.total_tokens - 1


def _work_of(chunks: list[tuple[Sequence, int]]) -> StepWork:
    decode = prefill_seqs = prefill_tokens = context = pairs = 0
    for seq, tokens in chunks:
        context += seq.computed + tokens
        pairs += tokens * seq.computed + tokens * (tokens + 1) // 2
        if _is_decode(seq, tokens):
            decode += 1
        else:
            prefill_seqs += 1
            prefill_tokens += tokens
    return StepWork(
        decode_seqs=decode,
        prefill_seqs=prefill_seqs,
        prefill_tokens=prefill_tokens,
        context_tokens=context,
        attention_pairs=pairs,
    )
