"""The engine without a clock: scheduler + cost model + memory pool. Real time and virtual time both drive it."""

from __future__ import annotations

from dataclasses import dataclass

from harness.sim.cost_model import StepWork
from harness.sim.engine_spec import EngineSpec
from harness.sim.noise import StepNoise
from harness.sim.scheduler import MemoryPool, Scheduler, Sequence


@dataclass(frozen=True)
class StepResult:
    duration_s: float
    work: StepWork
    emitted: list[tuple[Sequence, int]]  # (sequence, tokens this step gave it: more than 1 under speculation)
    finished: list[Sequence]
    preempted: list[Sequence]
    accepted: list[int]  # drafts accepted by each verify step (empty without speculation)


class RequestRejected(ValueError):
    """A request the engine can never serve (too long for the context or for memory); HTTP 400."""


def context_length_message(max_model_len: int, prompt_tokens: int, output_tokens: int) -> str:
    """vLLM's wording, so clients that parse it behave the same against the simulated engine."""
    return (
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{prompt_tokens + output_tokens} tokens ({prompt_tokens} in the messages, {output_tokens} in the "
        "completion). Please reduce the length of the messages or completion."
    )


class EngineCore:
    """`noise` (optional) multiplies every step time; without it the engine is deterministic."""

    def __init__(self, spec: EngineSpec, noise: StepNoise | None = None) -> None:
        self.spec = spec
        self.cost = spec.cost_model()
        self.noise = noise
        pool = MemoryPool(
            capacity_bytes=self.cost.pool_bytes(spec.gpu_memory_utilization),
            block_tokens=spec.block_tokens,
            block_bytes=spec.block_tokens * spec.shape.kv_bytes_per_token,
            state_bytes=spec.policy.memory_bytes_per_seq(spec.shape.recurrent, spec.spec_tokens),
        )
        self.pool = pool
        self.scheduler = Scheduler(spec.limits, pool, spec.speculation)

    def new_sequence(self, request_id: str, prompt_tokens: int, output_tokens: int) -> Sequence:
        """Validate and enqueue a request; raises `RequestRejected` with a vLLM-like message."""
        total = prompt_tokens + output_tokens
        if prompt_tokens < 1:
            raise RequestRejected("the prompt is empty; send at least one token")
        if total > self.spec.max_model_len:
            raise RequestRejected(context_length_message(self.spec.max_model_len, prompt_tokens, output_tokens))
        if not self.pool.fits_alone(total):
            raise RequestRejected(f"a request of {total} tokens does not fit in the simulated GPU memory")
        seq = Sequence(request_id=request_id, prompt_tokens=prompt_tokens, output_target=max(output_tokens, 1))
        self.scheduler.add(seq)
        return seq

    def step(self) -> StepResult | None:
        scheduled = self.scheduler.schedule()
        if scheduled is None:
            return None
        duration = self.cost.step_time(scheduled.work)
        if self.noise is not None:
            duration *= self.noise.factor()
        outcome = self.scheduler.complete(scheduled)
        return StepResult(
            duration_s=duration,
            work=scheduled.work,
            emitted=outcome.emitted,
            finished=outcome.finished,
            preempted=scheduled.preempted,
            accepted=outcome.accepted,
        )

    @property
    def max_concurrent_sequences(self) -> int:
        """How many sequences of `max_model_len` tokens fit in memory at once (capped by max_num_seqs)."""
        per_seq = self.pool.need_bytes(Sequence("probe", 0, 1), self.spec.max_model_len)
        return min(self.pool.capacity_bytes // per_seq, self.spec.limits.max_num_seqs)
