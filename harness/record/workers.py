"""`--workers N`: N recorder processes accept on one port (SO_REUSEPORT), each proxying and writing its own parts.

One Python process forwards at most a few thousand requests (or ~100k chunks) a second; more processes on one
port let the kernel spread connections over several cores. The parent only starts the workers, says where they
listen, forwards SIGINT/SIGTERM and adds their counters up for the summary. Each worker is a full recorder
(`service.record` with a `Shard`): its own segments and parts (`<stem>-w<i>-NNNN.parquet`), rotation and
fsync, so `--recover DIR` needs nothing new. A worker whose parent dies (even by `kill -9`) stops gracefully.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import secrets
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path

from harness.errors import UserError
from harness.record.options import RecordOptions
from harness.record.service import Shard, listen_error, naming_for, run_recorder, shown_url
from harness.record.stats import RecorderStats
from harness.signal_scope import signal_handlers

_START_TIMEOUT_S = 120.0


def _reserve_port(options: RecordOptions) -> socket.socket:
    """A bound, never-listening SO_REUSEPORT socket that holds the port (and picks one for port 0) while the
    workers, which bind it the same way, run; it receives no connections itself."""
    family, kind, proto, _, address = socket.getaddrinfo(options.host, options.port, type=socket.SOCK_STREAM)[0]
    # A plain bind first: it fails if anything listens there, even another `--workers` recorder (which would
    # otherwise silently share the port and split the traffic with this one).
    _bound(options, socket.socket(family, kind, proto), socket.SO_REUSEADDR, address).close()
    return _bound(options, socket.socket(family, kind, proto), socket.SO_REUSEPORT, address)


def _bound(options: RecordOptions, sock: socket.socket, option: int, address: tuple) -> socket.socket:
    sock.setsockopt(socket.SOL_SOCKET, option, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise listen_error(options, exc) from None
    return sock


@dataclass
class _Worker:
    process: BaseProcess
    results: Connection  # the worker sends ("listening", url), then ("stats", RecorderStats) or ("error", line)
    lifeline: Connection  # never written: the worker sees end of file when the parent is gone
    directory: Path


def run_workers(
    options: RecordOptions, announce: Callable[[str], None], report: Callable[[str], None]
) -> RecorderStats:
    """Run `options.workers` recorder processes until SIGINT/SIGTERM; their counters, added up."""
    context = multiprocessing.get_context("spawn")
    with _reserve_port(options) as holder:
        shared = replace(options, port=holder.getsockname()[1])
        key = secrets.token_bytes(32)
        workers: list[_Worker] = []
        for index in range(1, options.workers + 1):
            results, child_results = context.Pipe(duplex=False)
            child_lifeline, lifeline = context.Pipe(duplex=False)
            process = context.Process(
                target=_worker_main,
                args=(shared, Shard(index, key), child_results, child_lifeline),
                name=f"record-worker-{index}",
            )
            process.start()
            child_results.close()
            child_lifeline.close()
            workers.append(_Worker(process, results, lifeline, naming_for(shared, Shard(index, key)).directory))
        stop = {sig: lambda *_: _stop_all(workers) for sig in (signal.SIGINT, signal.SIGTERM)}
        with signal_handlers(stop):
            try:
                url = _await_listening(workers)
                first = naming_for(shared, Shard(1, key)).pattern.replace("-w1-", "-wN-")
                announce(
                    f"listening on {url} -> {shown_url(options)}; recording {options.redact!r} with "
                    f"{options.workers} workers to {first}"
                )
                return RecorderStats.added_up(_collect(workers, report))
            except BaseException:
                _stop_all(workers)
                raise
            finally:
                for worker in workers:
                    worker.process.join()


def _stop_all(workers: list[_Worker]) -> None:
    for worker in workers:
        if worker.process.is_alive():
            worker.process.terminate()  # SIGTERM: the worker drains and writes its last part


def _await_listening(workers: list[_Worker]) -> str:
    """The URL once every worker listens; UserError (after stopping the others) if one cannot start."""
    url = ""
    for worker in workers:
        results = worker.results
        if not results.poll(_START_TIMEOUT_S):
            raise UserError(
                f"a recorder worker did not start within {_START_TIMEOUT_S:.0f}s; the machine may be "
                "overloaded - try fewer --workers"
            )
        try:
            kind, value = results.recv()
        except EOFError:
            raise UserError("a recorder worker exited while starting; see the lines above") from None
        if kind == "error":
            raise UserError(value)
        url = value
    return url


def _collect(workers: list[_Worker], report: Callable[[str], None]) -> list[RecorderStats]:
    """Each worker's final counters (sent when it has written its last part); a worker that died reports a line."""
    waiting = {worker.results: (index, worker) for index, worker in enumerate(workers, 1)}
    collected: list[RecorderStats] = []
    while waiting:
        for ready in wait(list(waiting)):
            index, worker = waiting.pop(ready)  # type: ignore[call-overload]
            try:
                _, stats = worker.results.recv()
            except EOFError:
                report(
                    f"error: recorder worker {index} died; its rows are in its segment - run "
                    f"`replaybench record --recover {worker.directory}`"
                )
                stats = RecorderStats(worker_deaths=1)
            collected.append(stats)
    return collected


def _worker_main(options: RecordOptions, shard: Shard, results: Connection, lifeline: Connection) -> None:
    """Worker process: a full recorder on the shared port; ends on SIGINT/SIGTERM or when the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent forwards the terminal's Ctrl-C as SIGTERM
    threading.Thread(target=_stop_when_parent_gone, args=(lifeline,), daemon=True).start()

    def announce(line: str) -> None:  # "listening on URL -> ...": the parent prints one line for all
        results.send(("listening", line.split()[2]))

    def report(line: str) -> None:
        print(f"worker {shard.index}: {line}", file=sys.stderr, flush=True)

    try:
        stats = run_recorder(options, announce, report, lambda _line: None, shard)
    except UserError as problem:
        results.send(("error", str(problem)))
        return
    results.send(("stats", stats))


def _stop_when_parent_gone(lifeline: Connection) -> None:
    """The parent never writes to the lifeline: end of file means it is gone, so stop like on SIGTERM."""
    with contextlib.suppress(EOFError):
        lifeline.recv()
    os.kill(os.getpid(), signal.SIGTERM)
