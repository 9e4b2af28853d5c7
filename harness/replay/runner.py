"""`run_replay`: prepare every body, fork the sender processes on one t0, show progress, write the result file."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import aiohttp

from harness.errors import UserError
from harness.record.options import usable_cores
from harness.records.fidelity import offered_rate_of
from harness.records.result_schema import (
    META_ARM,
    META_OFFERED_RATE,
    META_REPEAT,
    META_REQUEST_ID_PREFIX,
    META_T0_MONOTONIC,
    META_T0_UNIX,
    META_TIME_SCALE,
    META_TRACE_SOURCE,
    META_URL,
)
from harness.records.trace_schema import META_SOURCE
from harness.replay import finalize as fin
from harness.replay.auto_workers import size_workers
from harness.replay.client import request_id_prefix
from harness.replay.counters import WorkerCounters
from harness.replay.loop_probe import probe_path
from harness.replay.options import ReplayOptions, ReplayOutcome
from harness.replay.payloads import PreparedRequest, prepare_requests
from harness.replay.progress import progress_display
from harness.replay.schedule import shard
from harness.replay.segments import owner_alive, partial_dir, segment_path, update_meta, write_meta
from harness.replay.server_probe import probe_server
from harness.replay.worker import StartSignals, WorkerJob, worker_main
from harness.signal_scope import signal_handlers
from harness.trace.model import Trace

START_DELAY_S = 0.2  # t0 lies this far after every worker is ready
StartGate = Callable[[], float]  # returns the shared t0 on time.monotonic()
WORKER_START_TIMEOUT_S = 60.0
WORKER_STOP_GRACE_S = 10.0
POLL_S = 0.1
PREPARE_TIMEOUT = aiohttp.ClientTimeout(total=120)


def normalise_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise UserError(f"--url {url!r} is not an http(s) URL; give e.g. http://127.0.0.1:8000")
    return url.rstrip("/").removesuffix("/v1")


async def _prepare(trace: Trace, url: str, options: ReplayOptions) -> list[PreparedRequest]:
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else None
    async with aiohttp.ClientSession(timeout=PREPARE_TIMEOUT, headers=headers) as session:
        server = await probe_server(session, url)
        try:
            return await prepare_requests(trace, url, options, server, session)
        except (aiohttp.ClientError, TimeoutError, KeyError, ValueError) as exc:
            raise UserError(
                f"synthesising prompts with {url}/tokenize failed ({type(exc).__name__}: {exc}); "
                "check the server's tokenizer endpoint or give a trace with prompt text"
            ) from None


def _run_meta(
    trace: Trace, url: str, options: ReplayOptions, arm: str, repeat: int, requests: list[PreparedRequest]
) -> dict[str, str]:
    rate = offered_rate_of([r.intended_s for r in requests])
    return options.extra_metadata | {
        META_ARM: arm,
        META_REPEAT: str(repeat),
        META_REQUEST_ID_PREFIX: request_id_prefix(arm, repeat),
        META_URL: url,
        META_TIME_SCALE: str(options.time_scale),
        META_OFFERED_RATE: "" if rate is None else repr(rate),
        META_TRACE_SOURCE: trace.metadata.get(META_SOURCE, ""),
        fin.META_SCHEDULED: str(len(requests)),
        fin.META_LAG_BUDGET_S: repr(options.lag_budget_s),
        fin.META_RECEIVE_LAG_BUDGET_S: repr(options.receive_lag_budget_s),
        fin.META_RATE_TOLERANCE: repr(options.rate_tolerance),
        fin.META_SEED: str(options.seed),
        fin.META_WORKERS: str(options.workers),
        fin.META_MAX_INFLIGHT: str(options.max_inflight or ""),
        fin.META_API: options.api or "trace",
        fin.META_STREAM: str(options.stream).lower(),
    }


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _stop_signals_interrupt() -> contextlib.AbstractContextManager[None]:
    """SIGTERM (a supervisor stopping us) and SIGINT end the run like Ctrl-C: finished rows are kept. SIGINT is
    set too (see ``signal_scope``): a process started with it ignored would otherwise run the whole trace after
    `kill -INT`."""
    return signal_handlers({signal.SIGTERM: _raise_interrupt, signal.SIGINT: signal.default_int_handler})


def _stop_workers(processes: list[mp.Process]) -> None:
    processes = [p for p in processes if p.pid is not None]  # a failed start leaves some never started
    deadline = time.monotonic() + WORKER_STOP_GRACE_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join()


def _await_ready(processes: list[mp.Process], signals: StartSignals) -> str | None:
    """Wait until every worker is ready; the reason they are not, if one died or they are too slow."""
    deadline = time.monotonic() + WORKER_START_TIMEOUT_S
    ready = 0
    while ready < len(processes):
        if signals.ready.acquire(timeout=POLL_S):
            ready += 1
        elif any(p.exitcode not in (None, 0) for p in processes):
            return "a replay worker died while starting"
        elif time.monotonic() > deadline:
            return f"replay workers did not start within {WORKER_START_TIMEOUT_S:g} s (machine overloaded?)"
    return None


@dataclass(frozen=True)
class WorkersEnd:
    interrupted: bool  # Ctrl-C / SIGTERM
    failed: tuple[str, ...]  # "worker K exited with code C" for each worker that died on its own


def _run_workers(
    requests: list[PreparedRequest],
    url: str,
    meta: dict[str, str],
    options: ReplayOptions,
    directory: Path,
    progress: bool,
    start_gate: StartGate | None,
) -> WorkersEnd:
    """Run the schedule on `options.workers` processes until they finish or the run is interrupted."""
    # forkserver, not fork: the caller may have threads (a fork would copy their held locks), and a clean
    # server process that has imported the worker code once starts each worker in milliseconds.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["harness.replay.worker"])
    counters = WorkerCounters(options.workers, ctx)
    signals = StartSignals(ready=ctx.Semaphore(0), go=ctx.Event(), stop=ctx.Event(), t0=ctx.Value("d", 0.0))
    processes = []
    for k in range(options.workers):
        job = WorkerJob(
            worker=k,
            requests=[requests[i] for i in shard(len(requests), options.workers, k)],
            url=url,
            arm=meta[META_ARM],
            repeat=int(meta[META_REPEAT]),
            options=options,
            segment=segment_path(directory, k),
            probe=probe_path(directory, k),
            parent_pid=os.getpid(),
            request_id_prefix=meta[META_REQUEST_ID_PREFIX],
        )
        processes.append(
            ctx.Process(target=worker_main, args=(job, counters, signals), daemon=True, name=f"replaybench-worker-{k}")
        )
    interrupted = False
    with _stop_signals_interrupt():
        try:
            for process in processes:
                process.start()
            not_started = _await_ready(processes, signals)
            if not_started:
                return WorkersEnd(interrupted=False, failed=(not_started,))
            t0 = start_gate() if start_gate is not None else time.monotonic() + START_DELAY_S
            signals.t0.value = t0
            t0_unix = time.time() + (t0 - time.monotonic())
            update_meta(directory, {META_T0_MONOTONIC: repr(t0), META_T0_UNIX: repr(t0_unix)})
            signals.go.set()
            with progress_display(len(requests), progress) as update:
                while any(p.is_alive() for p in processes):
                    update(counters.totals())
                    time.sleep(POLL_S)
                update(counters.totals())
        except KeyboardInterrupt:
            interrupted = True
        finally:
            signals.stop.set()
            _stop_workers(processes)
    failed = (
        ()
        if interrupted
        else tuple(
            f"worker {k} exited with code {p.exitcode}" for k, p in enumerate(processes) if p.exitcode not in (0, None)
        )
    )
    return WorkersEnd(interrupted=interrupted, failed=failed)


def _outcome(output: Path, directory: Path, complete: bool, interrupted: bool) -> ReplayOutcome:
    scheduled = int(fin.read_meta(directory)[fin.META_SCHEDULED])
    table, fidelity = fin.finalize(directory, output, complete=complete)
    return ReplayOutcome(
        path=output,
        fidelity=fidelity,
        complete=complete and table.num_rows == scheduled,
        interrupted=interrupted,
        requests=table.num_rows,
        scheduled=scheduled,
        errors=fin.error_counts(table),
    )


def _check_writable(output: Path) -> None:
    """Fail before any request is sent if the result file could not be written."""
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {output.parent} ({exc.strerror}); choose a writable -o path") from None
    if not os.access(output.parent, os.W_OK) or output.is_dir():
        raise UserError(f"cannot write {output}; choose a writable -o path (a file, not a directory)")


def run_replay(
    trace: Trace,
    url: str,
    options: ReplayOptions,
    output: str | os.PathLike[str],
    arm: str = "replay",
    repeat: int = 0,
    progress: bool = True,
    start_gate: StartGate | None = None,
) -> ReplayOutcome:
    """Replay `trace` open-loop against `url` and write the result file `output` (see the package docstring).

    `start_gate`, when given, is called once every request is prepared and every worker is ready; it returns
    the t0 (on `time.monotonic()`, which all processes of a host share) so several replays can share one clock.
    """
    url = normalise_url(url)
    output = Path(output)
    directory = partial_dir(output)
    if directory.exists():
        raise UserError(
            f"{directory} holds an interrupted replay; run `replaybench replay-recover {output}` "
            "to keep its rows, or delete it"
        )
    _check_writable(output)
    scaled = trace.slice(time_scale=options.time_scale)  # also re-bases: the first request is due at t0
    requests = asyncio.run(_prepare(scaled, url, options))
    options = size_workers(options, requests, usable_cores())
    meta = _run_meta(trace, url, options, arm, repeat, requests)
    write_meta(directory, meta)
    end = _run_workers(requests, url, meta, options, directory, progress, start_gate)
    outcome = _outcome(output, directory, complete=not (end.interrupted or end.failed), interrupted=end.interrupted)
    if end.failed:
        raise UserError(
            f"the replay failed ({'; '.join(end.failed)}); its {outcome.requests} finished requests "
            f"are in {output}, marked incomplete"
        )
    return outcome


def recover_replay(output: str | os.PathLike[str]) -> ReplayOutcome:
    """Finish the result file of a replay whose process died; every finished row is kept, complete=false."""
    output = Path(output)
    directory = partial_dir(output)
    if not (directory / "meta.json").exists():
        raise UserError(f"no interrupted replay next to {output} (expected {directory}); nothing to recover")
    if owner_alive(directory):
        raise UserError(f"the replay writing {output} is still running; stop it (Ctrl-C) instead of recovering")
    return _outcome(output, directory, complete=False, interrupted=True)
