"""Replay both arms at the same time (order = "simultaneous"): one process per arm, released together.

`run_replay` starts its own sender processes and wants no threads around, so each arm's replay runs in a
child process of its own; a barrier releases both at once. The children are *spawned* (fresh
interpreters), not forked: a forked child would inherit this process's multiprocessing state (e.g. a
forkserver it does not own) and could not start the replay's workers.
Both replays prepare their requests and start their workers, then meet at a barrier; the first one through
picks t0 on `time.monotonic()` (shared by every process of the host) and both schedules run from it. Ctrl-C
reaches both children (same process group); SIGTERM to replaybench is forwarded to them, and each keeps
the rows it finished.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.sharedctypes
import multiprocessing.synchronize
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UserError
from harness.replay import ReplayOptions, ReplayOutcome
from harness.trace.model import Trace


@dataclass(frozen=True)
class ReplayJob:
    arm: str
    repeat: int
    url: str
    output: Path
    options: ReplayOptions


SHARED_START_DELAY_S = 0.2  # t0 lies this far after both arms are ready
READY_TIMEOUT_S = 600.0  # preparing a long trace's prompts against a slow /tokenize can take minutes


def _shared_t0(barrier: mp.synchronize.Barrier, t0: mp.sharedctypes.Synchronized) -> float:
    """Wait for every arm to be ready; one of them sets t0, all return it."""
    try:
        if barrier.wait(timeout=READY_TIMEOUT_S) == 0:
            t0.value = time.monotonic() + SHARED_START_DELAY_S
        barrier.wait(timeout=READY_TIMEOUT_S)
    except threading.BrokenBarrierError:
        raise UserError("the other arm failed before the shared start; see its error") from None
    return float(t0.value)


def _child(
    trace: Trace, job: ReplayJob, barrier: mp.synchronize.Barrier, t0: mp.sharedctypes.Synchronized, results: mp.Queue
) -> None:
    from harness.replay import run_replay

    try:
        results.put(
            (
                job.arm,
                run_replay(
                    trace,
                    job.url,
                    job.options,
                    job.output,
                    arm=job.arm,
                    repeat=job.repeat,
                    progress=False,
                    start_gate=lambda: _shared_t0(barrier, t0),
                ),
            )
        )
    except UserError as error:
        results.put((job.arm, UserError(str(error))))


def replay_together(trace: Trace, jobs: list[ReplayJob]) -> dict[str, ReplayOutcome]:
    """Run every job concurrently; returns outcomes by arm. A `UserError` in either child is raised here."""
    ctx = mp.get_context("spawn")
    barrier, t0, results = ctx.Barrier(len(jobs)), ctx.Value("d", 0.0), ctx.Queue()
    children = [
        ctx.Process(target=_child, args=(trace, job, barrier, t0, results), name=f"replay-{job.arm}") for job in jobs
    ]
    outcomes: dict[str, ReplayOutcome | UserError] = {}
    try:
        for child in children:
            child.start()
        while len(outcomes) < len(jobs):
            if not any(child.is_alive() for child in children) and results.empty():
                break
            try:
                arm, outcome = results.get(timeout=0.5)
            except queue.Empty:
                if any(child.exitcode not in (0, None) for child in children):
                    barrier.abort()  # a crashed arm will never reach the shared start
                continue
            outcomes[arm] = outcome
            if isinstance(outcome, UserError):
                barrier.abort()  # release the other arm if it is still waiting for this one
    except BaseException:
        for child in children:
            if child.is_alive():
                child.terminate()  # SIGTERM: the child's replay ends like Ctrl-C and keeps its rows
        raise
    finally:
        for child in children:
            child.join()
    for arm, outcome in outcomes.items():
        if isinstance(outcome, UserError):
            raise UserError(f"arm {arm}: {outcome}")
    missing = [job.arm for job in jobs if job.arm not in outcomes]
    if missing:
        raise UserError(
            f"the replay process of arm(s) {', '.join(missing)} died without a result; "
            "see the attempts/ folder and re-run with --resume"
        )
    return outcomes  # type: ignore[return-value]
