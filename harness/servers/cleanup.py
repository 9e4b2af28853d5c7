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
from collections.abc import Iterator
from types import FrameType
from typing import Protocol


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


@contextlib.contextmanager
def termination_signals_raise() -> Iterator[None]:
    """While active, SIGTERM/SIGHUP raise `Terminated` and SIGINT raises KeyboardInterrupt.

    SIGINT is set explicitly because a process started with it ignored (a script's `cmd &`, some CI runners)
    inherits that, and Python then installs no KeyboardInterrupt: `kill -INT` would leave the servers running.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handlers = {signal.SIGTERM: _raise_terminated, signal.SIGHUP: _raise_terminated}
    handlers[signal.SIGINT] = signal.default_int_handler
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
