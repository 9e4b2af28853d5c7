"""Replay both arms at the same time (order = "simultaneous"): one process per arm, released together.

`run_replay` starts its own sender processes and wants no threads around, so each arm's replay runs in a
child process of its own; a barrier releases both at once. The children are *spawned* (fresh
interpreters), not forked: a forked child would inherit this process's multiprocessing state (e.g. a
forkserver it does not own) and could not start the replay's workers.
Both replays start their clocks when their request preparation ends, so the two t0 differ by at most
the difference in preparation time (prompt synthesis against each server), not by a whole run. Ctrl-C
reaches both children (same process group); SIGTERM to replaybench is forwarded to them, and each keeps
the rows it finished.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
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


def _child(trace: Trace, job: ReplayJob, barrier: mp.synchronize.Barrier, results: mp.Queue) -> None:
    from harness.replay import run_replay

    try:
        barrier.wait(timeout=120)
        results.put((job.arm, run_replay(trace, job.url, job.options, job.output, arm=job.arm, repeat=job.repeat,
                                         progress=False)))
    except UserError as error:
        results.put((job.arm, UserError(str(error))))


def replay_together(trace: Trace, jobs: list[ReplayJob]) -> dict[str, ReplayOutcome]:
    """Run every job concurrently; returns outcomes by arm. A `UserError` in either child is raised here."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(len(jobs)), ctx.Queue()
    children = [ctx.Process(target=_child, args=(trace, job, barrier, results), name=f"replay-{job.arm}")
                for job in jobs]
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
                continue
            outcomes[arm] = outcome
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
        raise UserError(f"the replay process of arm(s) {', '.join(missing)} died without a result; "
                        "see the attempts/ folder and re-run with --resume")
    return outcomes  # type: ignore[return-value]
