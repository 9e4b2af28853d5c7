"""However replaybench ends (Ctrl-C, SIGTERM, SIGKILL), no server it launched keeps running."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.servers import free_port
from tests.conftest import ignore_sigint, stray_servers, wait_for_no_strays

DRIVER = str(Path(__file__).with_name("launch_and_wait.py"))


@pytest.mark.parametrize(
    ("sig", "mode", "started_ignoring_sigint"),
    [
        (signal.SIGINT, "with", False),
        (signal.SIGINT, "with", True),
        (signal.SIGTERM, "with", False),
        (signal.SIGTERM, "atexit", False),
        (signal.SIGHUP, "atexit", False),
        (signal.SIGKILL, "atexit", False),
    ],
)
def test_launcher_death_leaves_no_orphans(tmp_path: Path, sig: int, mode: str, started_ignoring_sigint: bool) -> None:
    driver = subprocess.Popen(
        [sys.executable, DRIVER, str(free_port()), str(tmp_path / "log"), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ignore_sigint if started_ignoring_sigint else None,
    )
    try:
        assert driver.stdout is not None and driver.stdout.readline().strip() == "READY"
        assert len(stray_servers()) >= 2  # server + grandchild are running
        driver.send_signal(sig)
        driver.wait(timeout=30)
        if sig == signal.SIGKILL:  # only the watchdog (grace 5 s) and PDEATHSIG can act now
            assert wait_for_no_strays(15.0) == {}
        else:  # the driver itself stopped the whole group before it exited
            assert stray_servers() == {}
    finally:
        driver.kill()
        driver.wait()
