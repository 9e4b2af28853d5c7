"""The append-only segment file: a header line, then one JSON line per finished request.

Every line is written whole with one `write` on an O_APPEND descriptor and the file is fsync'ed at least
once a second, so after a crash everything but the last second is on disk and at most the final line is
torn. The writer holds an exclusive `flock` while recording, so recovery never touches a live segment.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from harness.record.row import RecordedRow

SEGMENT_FORMAT = "replaybench.segment/1"


class SegmentWriter:
    """Appends rows to one segment file; `append` raises OSError (disk full, I/O error) for the caller to count."""

    def __init__(self, path: Path, metadata: dict[str, str]) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._lock = threading.Lock()  # sync (worker thread) never races close
            self._closed = False
            self._torn = False  # True after a failed write left a fragment that the next line must not join
            self._dirty = False
            self.bytes_written = 0
            header = {"format": SEGMENT_FORMAT, "metadata": metadata}
            self.append_line(json.dumps(header, separators=(",", ":")).encode() + b"\n")
            self.sync()
        except BaseException:
            os.close(self._fd)
            raise

    def append_line(self, line: bytes) -> None:
        data = b"\n" + line if self._torn else line
        written = 0
        try:
            while written < len(data):
                written += os.write(self._fd, data[written:])
        except OSError:
            self._torn = self._torn or written > 0
            raise
        self._torn = False
        self._dirty = True
        self.bytes_written += written

    def append(self, row: RecordedRow) -> None:
        self.append_line(row.to_line())

    def sync(self) -> None:
        """fsync if anything was written since the last sync (safe to call from a worker thread)."""
        with self._lock:
            if self._dirty and not self._closed:
                self._dirty = False
                os.fsync(self._fd)

    def close(self) -> None:
        """Release the descriptor and the lock (call `sync` first to keep what was written)."""
        with self._lock:
            self._closed = True
            os.close(self._fd)


@dataclass
class SegmentContents:
    metadata: dict[str, str]
    rows: list[RecordedRow] = field(default_factory=list)
    bad_lines: int = 0  # torn (crash mid-write) or otherwise unreadable lines, skipped


def read_segment(path: Path) -> SegmentContents:
    """Read a segment, skipping (and counting) torn or unreadable lines; ValueError if it is not a segment."""
    lines = path.read_bytes().split(b"\n")
    try:
        header = json.loads(lines[0])
        if header.get("format") != SEGMENT_FORMAT:
            raise ValueError
        contents = SegmentContents({str(k): str(v) for k, v in header["metadata"].items()})
    except (ValueError, AttributeError, KeyError, TypeError):
        raise ValueError(f"{path} is not a replaybench segment file (bad first line)") from None
    for line in lines[1:]:
        if not line.strip():
            continue
        try:
            contents.rows.append(RecordedRow.from_line(line))
        except ValueError:
            contents.bad_lines += 1
    return contents


def try_lock(path: Path) -> int | None:
    """Open `path` and take its exclusive lock without waiting; None if a live recorder holds it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
