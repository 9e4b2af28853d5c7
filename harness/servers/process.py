"""Launch one inference server as its own process group, wait until it is ready, and stop it for sure."""

from __future__ import annotations

import ctypes
import ctypes.util
import datetime as dt
import os
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import UserError
from harness.servers import cleanup
from harness.servers.groups import terminate_group
from harness.servers.health import poll_ready
from harness.servers.ports import require_free_port
from harness.servers.watchdog import Watchdog

# Every process we launch carries this variable, so tests (and people) can find strays in the process table.
CHILD_MARKER = "REPLAYBENCH_CHILD"
LOG_TAIL_LINES = 15
LOG_HEADER = "=== replaybench "  # starts the line we write into a server log before each launch
_PR_SET_PDEATHSIG = 1


class ServerStartError(UserError):
    """The server exited during start-up or never became ready; the message quotes its last log lines."""


@dataclass(frozen=True)
class ServerSpec:
    """Everything needed to launch one arm's server. `gpus` become CUDA_VISIBLE_DEVICES when given."""

    label: str
    argv: tuple[str, ...]
    port: int
    ready_url: str
    startup_timeout_s: float = 120.0
    env: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[int, ...] = ()
    cwd: Path | None = None
    stop_grace_s: float = 15.0

    def child_env(self) -> dict[str, str]:
        env = dict(os.environ) | dict(self.env) | {CHILD_MARKER: "1"}
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu) for gpu in self.gpus)
        return env


def resolve_executable(argv0: str, cwd: Path | None) -> str | None:
    """Where `argv0` would be found (PATH, or relative to the server's working directory), or None."""
    if os.sep in argv0:
        path = Path(argv0) if Path(argv0).is_absolute() or cwd is None else cwd / argv0
        return str(path) if os.access(path, os.X_OK) and path.is_file() else None
    return shutil.which(argv0)


def _pdeathsig_preexec() -> Callable[[], None] | None:
    """A pre-exec hook asking the kernel to SIGKILL the child when its parent thread dies (Linux only).

    PDEATHSIG fires when the *thread* that forked dies, so it is only used from the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return None
    prctl = ctypes.CDLL(libc_name, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class ServerProcess:
    """One launched server: `start()`, `wait_ready()`, `stop()`; also a context manager that always stops."""

    def __init__(self, spec: ServerSpec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        self._popen: subprocess.Popen[bytes] | None = None
        self._exit_code: int | None = None

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen else None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.spec.port}"

    def start(self) -> None:
        spec = self.spec
        require_free_port(spec.port, spec.label)
        if resolve_executable(spec.argv[0], spec.cwd) is None:
            raise UserError(
                f"arm {spec.label}: command {spec.argv[0]!r} not found; install it or fix arms.{spec.label}.command"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        Watchdog.ensure_running()
        with open(self.log_path, "ab") as log:
            stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
            log.write(f"{LOG_HEADER}{stamp}: {shlex.join(spec.argv)}\n".encode())
            log.flush()
            try:
                self._popen = subprocess.Popen(
                    list(spec.argv),
                    env=spec.child_env(),
                    cwd=spec.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_pdeathsig_preexec(),
                )
            except OSError as error:
                raise UserError(
                    f"arm {spec.label}: cannot start {spec.argv[0]!r} ({error.strerror}); fix "
                    f"arms.{spec.label}.command or its cwd"
                ) from None
        Watchdog.guard(self._popen.pid)
        cleanup.track(self)

    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The exit status once the server has exited (negative: killed by that signal), else None."""
        return self._popen.poll() if self._popen else self._exit_code

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self) -> None:
        """Block until the readiness URL answers 200; a server that exits or times out is stopped and reported."""
        spec = self.spec
        if poll_ready(spec.ready_url, spec.startup_timeout_s, still_starting=self.running):
            return
        code = self.exit_code
        self.stop()
        what = (
            f"exited with code {code} during start-up"
            if code is not None
            else f"was not ready at {spec.ready_url} within {spec.startup_timeout_s:g} s"
        )
        raise ServerStartError(
            f"arm {spec.label}: server {what}; see {self.log_path} (fix the command or raise "
            f"arms.{spec.label}.startup_timeout_s). Last log lines: {' | '.join(self.log_tail().splitlines())}"
        )

    def stop(self) -> None:
        """SIGTERM the whole group, SIGKILL after the grace period; idempotent."""
        popen, self._popen = self._popen, None
        if popen is None:
            return
        terminate_group(popen.pid, self.spec.stop_grace_s, reap=popen.poll)
        popen.poll()
        self._exit_code = popen.returncode
        Watchdog.release(popen.pid)
        cleanup.untrack(self)

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
