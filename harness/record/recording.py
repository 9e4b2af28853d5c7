"""The recording's files over time: the open segment, its once-a-second fsync, rotation into Parquet parts.

A rotated segment is converted in a separate process, so that parsing and writing a large part never holds
the proxy's GIL (a thread would stall forwarding for the length of the conversion); the last part, after
shutdown has drained the traffic, is converted in-process.

Write problems never stop the proxy: each distinct problem is reported once as one error line, rows that
could not be written are counted, and opening a segment is retried (at most once a second) so recording
resumes by itself once the disk has room again.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from harness.record.naming import PartNaming
from harness.record.parts import PartWritten, finish_segment_when_free
from harness.record.row import RecordedRow
from harness.record.segment import SegmentWriter
from harness.record.stats import RecorderStats

SYNC_INTERVAL_S = 1.0
REOPEN_INTERVAL_S = 1.0
META_PART = "replaybench.record.part"


class Recording:
    def __init__(
        self, naming: PartNaming, metadata: dict[str, str], stats: RecorderStats, report: Callable[[str], None]
    ) -> None:
        self._naming = naming
        self._metadata = metadata
        self._stats = stats
        self._report = report
        self._reported: set[str] = set()
        self._index = naming.next_index()
        self._writer: SegmentWriter | None = None
        self._last_open_attempt = float("-inf")
        self._converter: ProcessPoolExecutor | None = None  # started at the first rotation
        self._finishing: set[asyncio.Future[None]] = set()  # rotated parts being converted

    @property
    def segment(self) -> Path | None:
        return self._writer.path if self._writer else None

    def _error_once(self, message: str) -> None:
        if message not in self._reported:
            self._reported.add(message)
            self._report(message)

    def open(self) -> None:
        """Start the current part's segment; on failure report it and leave recording off until a retry works."""
        self._last_open_attempt = time.monotonic()
        path = self._naming.segment(self._index)
        try:
            self._writer = SegmentWriter(path, self._metadata | {META_PART: str(self._index)})
        except BlockingIOError:
            self._error_once(
                f"error: another recorder is writing {path}; requests are still proxied but not "
                "recorded (each is counted) - give each recorder its own -o path"
            )
        except OSError as exc:
            self._error_once(
                f"error: cannot write {path} ({exc.strerror or exc}); requests are still proxied but "
                "not recorded (each is counted) - free disk space or choose a writable -o path"
            )

    def append(self, row: RecordedRow) -> None:
        if self._writer is None and time.monotonic() - self._last_open_attempt >= REOPEN_INTERVAL_S:
            self.open()
        if self._writer is None:
            self._stats.rows_lost += 1
            return
        try:
            self._writer.append(row)
        except OSError as exc:
            self._stats.rows_lost += 1
            self._error_once(
                f"error: cannot append to {self._writer.path} ({exc.strerror or exc}); requests are "
                "still proxied, unwritten rows are counted - free disk space"
            )
            return
        self._stats.recorded += 1

    async def sync_forever(self) -> None:
        while True:
            await asyncio.sleep(SYNC_INTERVAL_S)
            writer = self._writer
            if writer is not None:
                try:
                    await asyncio.to_thread(writer.sync)
                except OSError as exc:
                    self._error_once(
                        f"error: cannot fsync {writer.path} ({exc.strerror or exc}); the last second "
                        "of rows may not survive a crash - check the disk"
                    )

    async def rotate(self) -> None:
        """Close the current part and start the next one; the closed part is converted in a worker process."""
        old = self._writer
        if old is not None:
            self._index += 1
            self.open()
            if self._converter is None:
                self._converter = _converter_pool()
            finish = asyncio.ensure_future(self._finish(old, self._converter))
            self._finishing.add(finish)
            finish.add_done_callback(self._finishing.discard)
            # shutdown cancels the rotation loop, never a part's conversion: `close` waits for it (under load a
            # cancelled conversion left the whole part behind as a segment, without a word)
            await asyncio.shield(finish)

    async def close(self) -> None:
        await asyncio.gather(*self._finishing, return_exceptions=True)
        old, self._writer = self._writer, None
        if old is not None:
            await self._finish(old, None)
        if self._converter is not None:
            await asyncio.to_thread(self._converter.shutdown)

    async def _finish(self, writer: SegmentWriter, converter: Executor | None) -> None:
        """Sync and release the segment, then convert it (in `converter`, or a thread when None); any failure
        keeps the segment for `--recover` and says so."""
        try:
            await asyncio.to_thread(writer.sync)
        except OSError as exc:
            self._error_once(f"error: cannot fsync {writer.path} ({exc.strerror or exc}); check the disk")
        finally:
            writer.close()
        try:
            written = await self._convert(writer.path, converter)
        except Exception as exc:  # whatever went wrong, the rows are still in the segment
            self._keep(writer.path, str(exc))
            return
        if written is None and writer.path.exists():  # its lock was still held: never leave it without a word
            self._keep(writer.path, "its lock was still held")
            return
        if written is not None:
            self._stats.bad_lines += written.bad_lines
            if written.part is not None:
                self._stats.parts.append(written.part)
                self._stats.rows_in_parts += written.rows

    async def _convert(self, segment: Path, converter: Executor | None) -> PartWritten | None:
        """Convert in `converter`; a worker process that died (killed, out of memory) broke its pool, so the pool is
        replaced and the conversion tried once more there (it is idempotent: a part already written is kept)."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(converter, _convert, segment)
        except BrokenProcessPool:
            if self._converter is converter and converter is not None:  # the first to see it replaces it
                converter.shutdown(wait=False)
                self._converter = _converter_pool()
            return await loop.run_in_executor(self._converter, _convert, segment)

    def _keep(self, segment: Path, why: str) -> None:
        """The segment stays for `--recover`: counted (the recorder exits 1) and said once."""
        self._stats.segments_kept.append(segment)
        self._error_once(
            f"error: could not turn {segment} into Parquet ({why}); the segment is kept - "
            f"run `replaybench record --recover {segment.parent}` once the problem is fixed"
        )


def _converter_pool() -> ProcessPoolExecutor:
    """One worker, spawned (a forked child would inherit the proxy's event loop and sockets)."""
    return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))


def _convert(segment: Path) -> PartWritten | None:
    """Runs in the converter; errors come back as plain RuntimeErrors, which always cross a process boundary."""
    try:
        return finish_segment_when_free(segment)
    except Exception as exc:
        raise RuntimeError(str(exc)) from None
