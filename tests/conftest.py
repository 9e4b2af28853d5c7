"""Suite-wide guard: after every test, no server launched by replaybench may still be running.

The launcher marks every server with `REPLAYBENCH_CHILD=1` in its environment; this session also puts a
token in the environment that every child inherits, so the check sees only this pytest run's strays (other
test runs may be going on at the same time on a shared machine).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.servers import CHILD_MARKER

SESSION_MARKER = "REPLAYBENCH_TEST_SESSION"
os.environ.setdefault(SESSION_MARKER, uuid.uuid4().hex)
_SESSION_ENTRY = f"{SESSION_MARKER}={os.environ[SESSION_MARKER]}".encode()
_CHILD_ENTRY = f"{CHILD_MARKER}=1".encode()


def ignore_sigint() -> None:
    """A `preexec_fn` that starts a child the way a script's `cmd &` (and CI's runner) does: SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def stray_servers() -> dict[int, str]:
    """Live (non-zombie) processes of this test session that carry the launcher's marker: pid -> cmdline."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            if _CHILD_ENTRY not in environ or _SESSION_ENTRY not in environ:
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state not in ("Z", "X"):
            found[int(entry.name)] = cmdline.strip()
    return found


def wait_for_no_strays(timeout_s: float) -> dict[int, str]:
    """Poll until no stray is left or the timeout passes; returns what is still there."""
    deadline = time.monotonic() + timeout_s
    while (strays := stray_servers()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return strays


@pytest.fixture(autouse=True)
def _no_orphaned_servers() -> Iterator[None]:
    yield
    strays = wait_for_no_strays(1.0)
    for pid in strays:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if strays:
        pytest.fail(f"servers left running after the test (now killed): {strays}")
