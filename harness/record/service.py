"""One recording session: listen, proxy, fsync, rotate, and on SIGINT/SIGTERM drain and write the last part."""

from __future__ import annotations

import asyncio
import datetime as dt
import errno
import gc
import secrets
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from harness.errors import UserError
from harness.record.capture import Capturer
from harness.record.naming import PartNaming
from harness.record.options import RecordOptions
from harness.record.proxy import ProxySettings, RecordingProxy
from harness.record.recording import Recording
from harness.record.redact import Redactor
from harness.record.stats import RecorderStats
from harness.record.tokens import Tokenizer
from harness.records.trace_schema import (
    META_BLOCK_SIZE,
    META_CLOCK,
    META_REDACTION,
    META_SOURCE,
    META_TOKENIZER,
)

META_UPSTREAM = "replaybench.record.upstream"


@dataclass(frozen=True)
class Shard:
    """One of `--workers` processes: its number names its files; all share the port and the hash-mode key (so
    prefix block ids are comparable across the workers' parts)."""

    index: int
    key: bytes


def naming_for(options: RecordOptions, shard: Shard | None) -> PartNaming:
    naming = PartNaming.from_output(options.output)
    return naming.for_worker(shard.index) if shard is not None else naming


def shown_url(options: RecordOptions) -> str:
    """The upstream URL as printed and stored: without any user:password it may carry."""
    return str(options.upstream.with_user(None))


_CONNECT_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=30, sock_connect=30)


def _client_session() -> aiohttp.ClientSession:
    """No cookie jar (one client's cookies must never reach another), no env proxies, raw bytes both ways."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
        timeout=_CONNECT_TIMEOUT,
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        trust_env=False,
    )


def _metadata(options: RecordOptions, tokenizer: Tokenizer | None, started: dt.datetime) -> dict[str, str]:
    """Segment metadata; `clock` is the wall-clock time of the recorder's start (segment rows count from it)."""
    meta = {
        META_SOURCE: "replaybench record",
        META_UPSTREAM: shown_url(options),
        META_CLOCK: started.isoformat(timespec="microseconds"),
        META_REDACTION: options.redact,
    }
    if tokenizer is not None:
        meta |= {META_TOKENIZER: tokenizer.name, META_BLOCK_SIZE: str(options.block_size)}
    return meta


async def _rotate_forever(recording: Recording, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        await recording.rotate()


def listen_error(options: RecordOptions, exc: OSError) -> UserError:
    hint = "choose another --listen port" if exc.errno == errno.EADDRINUSE else "check the --listen address"
    return UserError(f"cannot listen on {options.host}:{options.port} ({exc.strerror or exc}); {hint}")


async def _start_site(runner: web.AppRunner, options: RecordOptions, reuse_port: bool) -> str:
    site = web.TCPSite(runner, options.host, options.port, backlog=4096, reuse_port=reuse_port)
    try:
        await site.start()
    except OSError as exc:
        raise listen_error(options, exc) from None
    host, port = runner.addresses[0][:2]
    return f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"


def run_recorder(
    options: RecordOptions,
    announce: Callable[[str], None],
    report: Callable[[str], None],
    show_status: Callable[[str], None],
    shard: Shard | None = None,
) -> RecorderStats:
    """`record` on uvloop when installed (it cuts the proxy's CPU per request), else on asyncio's own loop."""
    try:
        from uvloop import new_event_loop
    except ImportError:
        new_event_loop = None
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(record(options, announce, report, show_status, shard))


async def record(
    options: RecordOptions,
    announce: Callable[[str], None],
    report: Callable[[str], None],
    show_status: Callable[[str], None],
    shard: Shard | None = None,
) -> RecorderStats:
    """Run until SIGINT/SIGTERM; `announce` gets the listening line, `report` error lines, `show_status` the
    status line once a second. Returns the counters for the summary. A `shard` (one of `--workers`) joins the
    port with SO_REUSEPORT and writes its own parts."""
    started_at, started_wall = time.monotonic(), dt.datetime.now(dt.UTC)
    stats = RecorderStats()
    stop = _stop_on_signals()
    async with _client_session() as session:
        tokenizer = await Tokenizer.probe(session, options.upstream) if options.redact == "hash" else None
        metadata = _metadata(options, tokenizer, started_wall)
        naming = naming_for(options, shard)
        recording = Recording(naming, metadata, stats, report)
        key = shard.key if shard is not None else secrets.token_bytes(32)
        redactor = Redactor(options.redact, tokenizer, options.block_size, key=key)
        capturer = Capturer(secrets.token_hex(4), started_at, redactor, recording)
        settings = ProxySettings(options.upstream, options.max_body, options.session_header, options.tenant_header)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", RecordingProxy(settings, session, capturer, stats).handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=options.drain_s)
        await runner.setup()
        background: list[asyncio.Task[None]] = []
        try:
            url = await _start_site(runner, options, reuse_port=shard is not None)
            recording.open()
            _freeze_startup_heap()
            announce(f"listening on {url} -> {shown_url(options)}; recording {options.redact!r} to {naming.pattern}")
            background += [
                asyncio.create_task(recording.sync_forever()),
                asyncio.create_task(_status_forever(stats, recording, show_status)),
            ]
            if options.rotate_s > 0:
                background.append(asyncio.create_task(_rotate_forever(recording, options.rotate_s)))
            await stop.wait()
        finally:
            await runner.cleanup()  # stop listening, let in-flight requests finish (up to drain_s)
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await capturer.drain()
        await recording.close()
    return stats


def _freeze_startup_heap() -> None:
    """Move everything alive once listening (modules, pyarrow, the app: ~60k objects) out of the garbage
    collector's reach. A full collection then walks only what requests allocated, instead of stalling every
    stream for ~10 ms each time it runs."""
    gc.collect()
    gc.freeze()


def _stop_on_signals() -> asyncio.Event:
    """SIGINT and SIGTERM set the returned event: a graceful stop, never a traceback."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _status_forever(stats: RecorderStats, recording: Recording, show: Callable[[str], None]) -> None:
    while True:
        show(stats.status_line(recording.segment))
        await asyncio.sleep(1.0)
