"""Signal handlers for the span of a `with` block, the previous ones put back after it.

Why one place: the replay runner and the server cleanup both turn stop signals into exceptions while they run,
and both must set SIGINT themselves (a process started with it ignored, as a script's `cmd &` or a CI runner
starts it, gets no KeyboardInterrupt otherwise).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Any

Handler = Callable[[int, FrameType | None], Any]


@contextlib.contextmanager
def signal_handlers(handlers: Mapping[signal.Signals, Handler]) -> Iterator[None]:
    """Install ``handlers`` while the block runs. Only the main thread may: elsewhere the block runs as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
