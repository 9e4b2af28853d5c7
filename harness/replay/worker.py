"""One sender process: its own event loop and connection pool, a shard of the schedule, a shared t0.

Start protocol: the worker opens its session and segment, signals `ready`, then waits for `go`; the parent
writes the absolute t0 (time.monotonic(), system-wide on Linux) into `t0` before setting `go`. The worker
ignores SIGINT (the parent owns Ctrl-C) and stops sending when `stop` is set or the parent disappears;
requests still in flight then are cancelled and not written.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event, Semaphore
from pathlib import Path

import aiohttp

from harness.replay.client import ClientSettings, queue_timeout_row, send
from harness.replay.counters import DONE, ERRORS, INFLIGHT, LAG, SENT, WorkerCounters
from harness.replay.loop_probe import LoopProbe
from harness.replay.options import ReplayOptions
from harness.replay.payloads import PreparedRequest
from harness.replay.schedule import wait_until
from harness.replay.segments import FLUSH_PERIOD_S, SegmentWriter

WATCHDOG_PERIOD_S = FLUSH_PERIOD_S
WARM_CONNECTIONS = 32  # opened before t0 so the first requests do not pay for TCP connects
# Idle keep-alive connections are closed by us before the server does (vLLM/uvicorn: after 5 s): a POST sent
# on a connection the server is closing at that moment would fail as a broken stream through no fault of it.
KEEPALIVE_S = 2.0


@dataclass(frozen=True)
class WorkerJob:
    worker: int
    requests: list[PreparedRequest]
    url: str
    arm: str
    repeat: int
    options: ReplayOptions
    segment: Path
    probe: Path  # where the worker's loop probe writes its receive lag samples
    parent_pid: int
    request_id_prefix: str  # client.request_id_prefix: the run's, shared by every worker


@dataclass(frozen=True)
class StartSignals:
    """Shared between the parent and every worker of one run."""

    ready: Semaphore
    go: Event
    stop: Event
    t0: Synchronized  # multiprocessing.Value("d")


def worker_main(job: WorkerJob, counters: WorkerCounters, signals: StartSignals) -> None:
    """Process entry point."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with asyncio.Runner(loop_factory=fast_loop_factory()) as runner:
        runner.run(_worker(job, counters, signals))


def fast_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed (it roughly doubles how many requests one process sends and reads), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _parent_alive(pid: int) -> bool:
    """Whether the replay's parent still runs (workers are children of the forkserver, not of it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _stopping(job: WorkerJob, signals: StartSignals) -> bool:
    return signals.stop.is_set() or not _parent_alive(job.parent_pid)


async def _worker(job: WorkerJob, counters: WorkerCounters, signals: StartSignals) -> None:
    options = job.options
    headers = {"Content-Type": "application/json"}
    if options.api_key:
        headers["Authorization"] = f"Bearer {options.api_key}"
    timeout = aiohttp.ClientTimeout(
        total=options.request_timeout_s, sock_connect=options.read_timeout_s, sock_read=options.read_timeout_s
    )
    writer = SegmentWriter(job.segment)
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, keepalive_timeout=KEEPALIVE_S)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        await _warm_pool(session, job.url, min(WARM_CONNECTIONS, len(job.requests)), headers)
        gc.freeze()  # the prepared requests never die: keep them out of every later collection's scan
        signals.ready.release()
        while not signals.go.wait(WATCHDOG_PERIOD_S):
            if _stopping(job, signals):
                writer.close()
                return
        settings = ClientSettings(
            url=job.url,
            arm=job.arm,
            repeat=job.repeat,
            worker=job.worker,
            t0=signals.t0.value,
            stream=options.stream,
            keep_text=options.save_outputs,
            headers=headers,
            timeout=timeout,
            request_id_prefix=job.request_id_prefix,
        )
        await _run_shard(job, session, settings, writer, counters, signals)
    writer.close()


async def _warm_pool(session: aiohttp.ClientSession, url: str, connections: int, headers: dict[str, str]) -> None:
    """Open `connections` keep-alive connections (GET /v1/models) that the pool then reuses; failures are harmless."""

    async def touch() -> None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(f"{url}/v1/models", headers=headers, timeout=aiohttp.ClientTimeout(total=10)) as r:
                await r.read()

    await asyncio.gather(*(touch() for _ in range(connections)))


async def _run_shard(
    job: WorkerJob,
    session: aiohttp.ClientSession,
    settings: ClientSettings,
    writer: SegmentWriter,
    counters: WorkerCounters,
    signals: StartSignals,
) -> None:
    w = job.worker
    slots = asyncio.Semaphore(job.options.max_inflight) if job.options.max_inflight else None
    queue_timeout_s = job.options.queue_timeout_s or job.options.request_timeout_s
    pending: set[asyncio.Task[None]] = set()

    async def one(request: PreparedRequest) -> None:
        if slots is not None:
            try:
                await asyncio.wait_for(slots.acquire(), timeout=queue_timeout_s)
            except TimeoutError:
                writer.write(queue_timeout_row(request, settings))
                counters.add(w, DONE, 1)
                counters.add(w, ERRORS, 1)
                return
        counters.set(w, LAG, time.monotonic() - settings.t0 - request.intended_s)
        counters.add(w, SENT, 1)
        counters.add(w, INFLIGHT, 1)
        try:
            row = await send(session, request, settings)
        finally:
            counters.add(w, INFLIGHT, -1)
            if slots is not None:
                slots.release()
        writer.write(row)
        counters.add(w, DONE, 1)
        counters.add(w, ERRORS, row.error is not None)

    async def schedule() -> None:
        loop = asyncio.get_running_loop()
        for request in job.requests:
            await wait_until(settings.t0 + request.intended_s)
            task = loop.create_task(one(request))
            pending.add(task)
            task.add_done_callback(pending.discard)

    async def watchdog(scheduler: asyncio.Task[None]) -> None:
        """Flushes finished rows on a fixed beat and stops everything when asked to (or orphaned)."""
        while not _stopping(job, signals):
            await asyncio.sleep(WATCHDOG_PERIOD_S)
            writer.flush()
        scheduler.cancel()
        for task in list(pending):
            task.cancel()

    probe = LoopProbe(job.probe)
    sampling = asyncio.create_task(probe.run())
    scheduler = asyncio.create_task(schedule())
    guard = asyncio.create_task(watchdog(scheduler))
    with contextlib.suppress(asyncio.CancelledError):
        await scheduler
    while pending:
        await asyncio.wait(list(pending))
    guard.cancel()
    sampling.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sampling
    probe.stop()
