"""Client side of the watchdog (see `guardian.py`): start it once, tell it which server groups are live."""

from __future__ import annotations

import os
import subprocess
import sys
import threading


class Watchdog:
    """Client side: one watchdog process per replaybench process, started on first use."""

    _lock = threading.Lock()
    _process: subprocess.Popen[bytes] | None = None
    _owner_pid: int | None = None

    @classmethod
    def _pipe(cls) -> subprocess.Popen[bytes]:
        if cls._process is None or cls._owner_pid != os.getpid() or cls._process.poll() is not None:
            cls._process = subprocess.Popen(
                [sys.executable, "-m", "harness.servers.guardian", str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
            cls._owner_pid = os.getpid()
        return cls._process

    @classmethod
    def ensure_running(cls) -> None:
        """Start the watchdog now (before a server is launched) so no launch is ever unguarded."""
        with cls._lock:
            cls._pipe()

    @classmethod
    def _send(cls, line: str) -> None:
        with cls._lock:
            pipe = cls._pipe().stdin
            assert pipe is not None
            try:
                pipe.write(f"{line}\n".encode())
                pipe.flush()
            except BrokenPipeError:  # the watchdog was killed; the next call starts a new one
                cls._process = None

    @classmethod
    def guard(cls, pgid: int) -> None:
        cls._send(f"add {pgid}")

    @classmethod
    def release(cls, pgid: int) -> None:
        cls._send(f"del {pgid}")
