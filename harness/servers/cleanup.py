"""No orphaned servers: every launched server is tracked here and stopped on exit, Ctrl-C or SIGTERM.

Three layers, because each covers a way replaybench can die that the others cannot:
- normal return, exception, Ctrl-C, SIGTERM/SIGHUP: `finally` blocks and `atexit` call `stop_all()`
  (`termination_signals_raise()` turns SIGINT/SIGTERM/SIGHUP into an exception so `finally` runs);
- SIGKILL or a hard crash of replaybench: the `Watchdog` process notices and kills the groups;
- the server's first process also gets PR_SET_PDEATHSIG (set in `process.py`) as a last resort.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import threading
from types import FrameType
from typing import Protocol

from harness.signal_scope import signal_handlers


class Stoppable(Protocol):
    def stop(self) -> None: ...


_live: list[Stoppable] = []
_lock = threading.Lock()


def track(server: Stoppable) -> None:
    with _lock:
        _live.append(server)


def untrack(server: Stoppable) -> None:
    with _lock:
        if server in _live:
            _live.remove(server)


def stop_all() -> None:
    """Stop every server still running (newest first); safe to call more than once."""
    while True:
        with _lock:
            if not _live:
                return
            server = _live[-1]
        server.stop()
        untrack(server)


atexit.register(stop_all)


class Terminated(SystemExit):
    """Raised in the main thread when SIGTERM or SIGHUP arrives, so every `finally` runs and servers stop."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def _raise_terminated(signum: int, _frame: FrameType | None) -> None:
    raise Terminated(signum)


def termination_signals_raise() -> contextlib.AbstractContextManager[None]:
    """While active, SIGTERM/SIGHUP raise `Terminated` and SIGINT raises KeyboardInterrupt (set explicitly: see
    ``signal_scope``), so `kill -INT` of a process started with SIGINT ignored still stops its servers."""
    return signal_handlers(
        {signal.SIGTERM: _raise_terminated, signal.SIGHUP: _raise_terminated, signal.SIGINT: signal.default_int_handler}
    )
