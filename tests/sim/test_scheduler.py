"""The vLLM-V1-like scheduler: token budget, chunked prefill, sequence cap, memory admission, preemption."""

from __future__ import annotations

from harness.sim.cost_model import StepWork
from harness.sim.scheduler import MemoryPool, Scheduler, SchedulerLimits, Sequence

BLOCK_BYTES = 100


def make(limits: SchedulerLimits, capacity_blocks: int, state_blocks: int = 0) -> Scheduler:
    pool = MemoryPool(
        capacity_bytes=capacity_blocks * BLOCK_BYTES,
        block_tokens=16,
        block_bytes=BLOCK_BYTES,
        state_bytes=state_blocks * BLOCK_BYTES,
    )
    return Scheduler(limits, pool)


def run_to_end(scheduler: Scheduler, max_steps: int = 10_000) -> list[StepWork]:
    works = []
    while scheduler.has_work() and len(works) < max_steps:
        step = scheduler.schedule()
        assert step is not None
        works.append(step.work)
        scheduler.complete(step)
    return works


def test_chunked_prefill_respects_the_token_budget() -> None:
    scheduler = make(SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=100), capacity_blocks=1000)
    seq = Sequence("a", prompt_tokens=250, output_target=3)
    scheduler.add(seq)
    works = run_to_end(scheduler)
    assert [w.prefill_tokens for w in works] == [100, 100, 50, 0, 0]
    assert [w.decode_seqs for w in works] == [0, 0, 0, 1, 1]
    assert seq.finished and seq.output_count == 3
    assert scheduler.pool.used_bytes == 0


def test_decodes_go_first_and_waiting_requests_fill_the_rest_fcfs() -> None:
    scheduler = make(SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=64), capacity_blocks=1000)
    first = Sequence("first", prompt_tokens=10, output_target=5)
    scheduler.add(first)
    scheduler.complete(scheduler.schedule())  # prefill -> first token
    second, third = Sequence("second", 60, 2), Sequence("third", 60, 2)
    scheduler.add(second)
    scheduler.add(third)
    step = scheduler.schedule()
    assert [(c.seq.request_id, c.tokens) for c in step.chunks] == [("first", 1), ("second", 60), ("third", 3)]
    assert step.work.decode_seqs == 1 and step.work.prefill_tokens == 63


def test_max_num_seqs_caps_the_running_set() -> None:
    scheduler = make(SchedulerLimits(max_num_seqs=2, max_num_batched_tokens=1000), capacity_blocks=1000)
    for i in range(5):
        scheduler.add(Sequence(f"r{i}", 10, 4))
    step = scheduler.schedule()
    assert len(step.chunks) == 2 and len(scheduler.waiting) == 3
    works = [step.work, *run_to_end_after(scheduler, step)]
    assert max(w.seqs for w in works) == 2


def run_to_end_after(scheduler: Scheduler, step) -> list[StepWork]:
    scheduler.complete(step)
    return run_to_end(scheduler)


def test_admission_waits_for_memory_including_ssm_state() -> None:
    # each sequence: 1 KV block (<= 16 tokens) + 3 blocks of state; 8 blocks fit two sequences
    scheduler = make(SchedulerLimits(max_num_seqs=10, max_num_batched_tokens=1000), capacity_blocks=8, state_blocks=3)
    for i in range(3):
        scheduler.add(Sequence(f"r{i}", 8, 2))
    step = scheduler.schedule()
    assert len(step.chunks) == 2 and len(scheduler.waiting) == 1
    run_to_end_after(scheduler, step)
    assert scheduler.preemptions == 0 and not scheduler.has_work()


def test_preemption_recomputes_and_every_request_still_finishes() -> None:
    # 6 blocks: two sequences fit at admission, but not once both grow past 3 blocks each
    scheduler = make(SchedulerLimits(max_num_seqs=10, max_num_batched_tokens=1000), capacity_blocks=6)
    seqs = [Sequence(f"r{i}", 16, 40) for i in range(2)]
    for seq in seqs:
        scheduler.add(seq)
    works = run_to_end(scheduler)
    assert scheduler.preemptions >= 1
    assert all(s.finished and s.output_count == 40 for s in seqs)
    assert seqs[1].preemptions >= 1 and seqs[0].preemptions == 0  # the latest admitted is the victim
    assert any(w.prefill_tokens > 16 for w in works)  # recompute prefills prompt + generated tokens
    assert scheduler.pool.used_bytes == 0


def test_aborted_sequence_frees_its_memory() -> None:
    scheduler = make(SchedulerLimits(), capacity_blocks=100)
    seq = Sequence("a", 40, 100)
    scheduler.add(seq)
    scheduler.complete(scheduler.schedule())
    assert scheduler.pool.used_bytes > 0
    scheduler.abort(seq)
    assert scheduler.schedule() is None
    assert scheduler.pool.used_bytes == 0 and not scheduler.has_work()
