"""Process groups: every server runs in its own, so one signal reaches the server and all its children."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

_PROC = Path("/proc")


def _live_members(pgid: int) -> list[int]:
    """Pids in the group that are not zombies (a zombie is already dead; it only waits to be reaped)."""
    members = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command name: state ppid pgrp ...
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def group_alive(pgid: int) -> bool:
    """True while any process of the group is still running."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return bool(_live_members(pgid)) if _PROC.is_dir() else True


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to the whole group; a group that is already gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def wait_group_exit(pgid: int, timeout_s: float, reap: Callable[[], object] | None = None) -> bool:
    """Poll until the group is empty or `timeout_s` passes; `reap` lets the parent collect its zombie child."""
    deadline = time.monotonic() + timeout_s
    while True:
        if reap is not None:
            reap()
        if not group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def terminate_group(pgid: int, grace_s: float, reap: Callable[[], object] | None = None) -> bool:
    """SIGTERM the group, wait up to `grace_s`, then SIGKILL what is left. True when it stopped gracefully."""
    signal_group(pgid, signal.SIGTERM)
    if wait_group_exit(pgid, grace_s, reap):
        return True
    signal_group(pgid, signal.SIGKILL)
    wait_group_exit(pgid, 5.0, reap)
    return False
