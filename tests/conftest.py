"""Suite-wide guard: after every test, no server launched by replaybench may still be running.

The launcher marks every server with `REPLAYBENCH_CHILD=1` in its environment; this session also puts a
token in the environment that every child inherits, so the check sees only this pytest run's strays (other
test runs may be going on at the same time on a shared machine). Under pytest-xdist (`make test`) the token is
per worker: the other workers' tests run at the same time, and their servers are not this worker's strays.

Tests marked `timing` (they assert wall-clock pace or lag) run alone under pytest-xdist: the other workers wait
between tests until one is done, so it sees the same host as in a serial run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.servers import CHILD_MARKER

SESSION_MARKER = "REPLAYBENCH_TEST_SESSION"
# setdefault: this file is imported twice in one process (as pytest's conftest and as tests.conftest), and the second
# import must keep the first one's token. An xdist worker inherits the controller's token: it adds its own id once.
_token = os.environ.setdefault(SESSION_MARKER, uuid.uuid4().hex)
if (_worker := os.environ.get("PYTEST_XDIST_WORKER")) and not _token.endswith(f"/{_worker}"):
    os.environ[SESSION_MARKER] = f"{_token}/{_worker}"
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


@contextlib.contextmanager
def _turn(folder: Path, alone: bool) -> Iterator[None]:
    """Hold the run's shared lock for one test, exclusively when `alone`. A test that waits to run alone first takes
    the gate, which every test takes on its way in, so the others cannot keep it waiting by overlapping."""
    with open(folder / "tests-gate.lock", "a") as gate, open(folder / "tests-running.lock", "a") as running:
        fcntl.flock(gate, fcntl.LOCK_EX)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        fcntl.flock(running, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        yield


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: the wait is no part of the test's timeout or duration
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    workerinput = getattr(item.config, "workerinput", None)
    if workerinput is None or workerinput["workercount"] == 1:  # not under xdist: nothing else runs meanwhile
        return (yield)
    # every worker's basetemp is a folder of the controller's, which is this run's alone
    with _turn(Path(item.config.option.basetemp).parent, alone=item.get_closest_marker("timing") is not None):
        return (yield)
