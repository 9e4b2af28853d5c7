"""A continuous-batching scheduler modelled on vLLM V1: what each engine step computes.

Per step: running sequences first (decodes and unfinished prefill chunks, in admission order), then waiting
ones FCFS, within a token budget (chunked prefill) and a running-sequence cap. Memory is one pool of bytes:
KV blocks grow with the context, and each admitted sequence holds its SSM state (incl. ReplaySSM's ring and
bf16 copy). When a running sequence cannot grow, the most recently admitted one is preempted (its memory is
freed and it is recomputed from scratch later, as vLLM's recompute preemption does).

With speculative decoding every decode is a verify step: the sequence's last token plus k drafts go through
the model (1 + k tokens of the budget and of KV room), and the step emits the accepted drafts plus one token,
so a sequence can gain several tokens in one step (`Speculation`). Its state is sized for 1 + k copies by the
state policy.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from harness.sim.cost_model import StepWork
from harness.sim.speculation import Speculation


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


class Chunk(NamedTuple):
    """What one step computes for one sequence: `tokens` new context tokens, of which `drafts` are drafts."""

    seq: Sequence
    tokens: int
    drafts: int = 0


@dataclass
class ScheduledStep:
    chunks: list[Chunk]
    work: StepWork
    preempted: list[Sequence] = field(default_factory=list)


@dataclass
class StepOutcome:
    """After a step: (sequence, tokens it produced), those now finished, and the drafts each verify accepted."""

    emitted: list[tuple[Sequence, int]]
    finished: list[Sequence]
    accepted: list[int] = field(default_factory=list)  # one entry per verify step (0..k)


class Scheduler:
    def __init__(
        self, limits: SchedulerLimits, pool: MemoryPool, speculation: Speculation | None = None, seed: int = 0
    ) -> None:
        self.limits, self.pool, self.speculation = limits, pool, speculation
        self._acceptance = random.Random(seed)
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
        chunks: list[Chunk] = []
        preempted: list[Sequence] = []
        for seq in list(self.running):
            if budget == 0 or not seq.holds_state:  # the rest were preempted just now
                break
            drafts = self._drafts(seq, budget)
            tokens = min(seq.remaining, budget) + drafts
            if not self._grow_or_preempt(
                seq, min(tokens, seq.prompt_tokens + seq.output_target - seq.computed), preempted
            ):
                break
            chunks.append(Chunk(seq, tokens, drafts))
            budget -= tokens
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.limits.max_num_seqs:
            seq = self.waiting[0]
            tokens = min(seq.remaining, budget)
            if not self.pool.try_grow(seq, seq.computed + tokens):
                break
            self.waiting.popleft()
            self.running.append(seq)
            chunks.append(Chunk(seq, tokens))
            budget -= tokens
        if not chunks:
            return None
        return ScheduledStep(chunks=chunks, work=_work_of(chunks), preempted=preempted)

    def _drafts(self, seq: Sequence, budget: int) -> int:
        """Drafts to verify with this decode (k under speculation, if the token budget has room), else 0."""
        k = self.speculation.tokens if self.speculation else 0
        return k if k and seq.output_count > 0 and seq.remaining == 1 and budget > k else 0

    def complete(self, step: ScheduledStep) -> StepOutcome:
        """Advance every scheduled sequence by its chunk; a sequence whose context is complete samples a token
        (a verify step: one plus the drafts it accepted, at most the tokens still to go)."""
        emitted: list[tuple[Sequence, int]] = []
        finished: list[Sequence] = []
        accepted: list[int] = []
        for seq, tokens, drafts in step.chunks:
            if seq.aborted:
                continue
            produced = 1
            if drafts and self.speculation:
                accepted.append(self.speculation.accepted(self._acceptance))
                produced = min(1 + accepted[-1], seq.output_target - seq.output_count)
            seq.computed += tokens - drafts + produced - 1
            if seq.computed < seq.total_tokens:
                continue
            seq.output_count += produced
            emitted.append((seq, produced))
            if seq.output_count >= seq.output_target:
                seq.finished = True
                finished.append(seq)
                self.pool.release(seq)
        if finished:
            self.running = [s for s in self.running if not s.finished]
        return StepOutcome(emitted=emitted, finished=finished, accepted=accepted)


def _is_decode(seq: Sequence, tokens: int) -> bool:
    return tokens == 1 and seq.output_count > 0 and seq.computed == seq.total_tokens - 1


def _work_of(chunks: list[Chunk]) -> StepWork:
    decode = prefill_seqs = prefill_tokens = context = pairs = draft_tokens = 0
    for seq, tokens, drafts in chunks:
        context += seq.computed + tokens
        pairs += tokens * seq.computed + tokens * (tokens + 1) // 2
        if _is_decode(seq, tokens - drafts):
            decode += 1
            draft_tokens += drafts
        else:
            prefill_seqs += 1
            prefill_tokens += tokens
    return StepWork(
        decode_seqs=decode,
        prefill_seqs=prefill_seqs,
        prefill_tokens=prefill_tokens,
        context_tokens=context,
        attention_pairs=pairs,
        draft_tokens=draft_tokens,
    )
