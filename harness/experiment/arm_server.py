"""One arm's server as the runner sees it: launched by us (a `command`) or attached to (a `url`).

Either way it offers `start(log)` (ready when it returns), `alive()`, `stop()` and `base_url`; an
attached server is never started or stopped, only checked.
"""

from __future__ import annotations

from pathlib import Path

from harness.errors import UserError
from harness.experiment.config import ArmConfig, substitute
from harness.servers import ServerProcess, ServerSpec, ServerStartError, probe, server_identity
from harness.servers.health import poll_ready
from harness.servers.process import LOG_HEADER

ARM_ENV = "REPLAYBENCH_ARM"
REPEAT_ENV = "REPLAYBENCH_REPEAT"


def ready_url(arm: ArmConfig, base_url: str) -> str:
    return arm.ready_url if arm.ready_url.startswith(("http://", "https://")) else base_url + arm.ready_url


def server_spec(
    label: str, arm: ArmConfig, gpus: tuple[int, ...] | None = None, repeat: int | None = None
) -> ServerSpec:
    """How to launch the arm; `gpus` overrides `arm.gpus` (placement), `repeat` is told to the server.

    Every launched server sees REPLAYBENCH_ARM (and REPLAYBENCH_REPEAT during a paired repeat), so a server that
    seeds something per repeat (the embedded engine's noise) can; real servers ignore them.
    """
    assert arm.command is not None
    base = f"http://127.0.0.1:{arm.port}"
    told = {ARM_ENV: label} | ({REPEAT_ENV: str(repeat)} if repeat is not None else {})
    return ServerSpec(
        label=label,
        argv=substitute(arm.command, arm.port),
        port=arm.port,
        ready_url=ready_url(arm, base),
        startup_timeout_s=arm.startup_timeout_s,
        env=told | arm.env,
        gpus=tuple(arm.gpus) if gpus is None else gpus,
        cwd=arm.cwd,
        stop_grace_s=arm.stop_grace_s,
    )


class ArmServer:
    def __init__(self, label: str, arm: ArmConfig) -> None:
        self.label = label
        self.arm = arm
        self.base_url = arm.url.rstrip("/") if arm.url else f"http://127.0.0.1:{arm.port}"
        self.ready_url = ready_url(arm, self.base_url)
        self._process: ServerProcess | None = None
        self.log_path: Path | None = arm.log
        self.gpus: tuple[int, ...] = tuple(arm.gpus)  # where the server runs (or last ran)

    def start(self, log_path: Path, gpus: tuple[int, ...] | None = None, repeat: int | None = None) -> None:
        """Launch (or, for a `url` arm, find) the server and return once it is ready.

        `gpus` places a launched server (default: the arm's own); an attached server stays where it is.
        """
        if self.arm.launched:
            self.stop()
            spec = server_spec(self.label, self.arm, gpus, repeat)
            self.gpus = spec.gpus
            self._process = ServerProcess(spec, log_path)
            self.log_path = log_path
            self._process.start()
            self._process.wait_ready()
        elif not poll_ready(self.ready_url, self.arm.startup_timeout_s):
            raise ServerStartError(
                f"arm {self.label}: nothing ready at {self.ready_url} within "
                f"{self.arm.startup_timeout_s:g} s; start that server or fix arms.{self.label}.url"
            )

    def alive(self) -> bool:
        """False when the server died (a launched process exited, or an attached one stopped answering)."""
        if self.arm.launched:
            return self._process is not None and self._process.running()
        return probe(self.ready_url) == 200

    def exit_description(self) -> str:
        if self._process is not None and self._process.exit_code is not None:
            return f"server exited with code {self._process.exit_code}"
        return f"server stopped answering at {self.ready_url}"

    def identity(self) -> dict[str, object]:
        """Version and models as the server reports them, plus the declared expectations it is checked against."""
        return server_identity(self.base_url) | {
            "url": self.base_url,
            "launched": self.arm.launched,
            "command": list(self.arm.command or []),
        }

    def verify(self, identity: dict[str, object]) -> None:
        """The server is the version, and has the plugin, that the config declares."""
        arm = self.arm
        if arm.version is not None and identity.get("version") != arm.version:
            raise UserError(
                f"arm {self.label}: server reports version {identity.get('version')!r}, the config "
                f"declares {arm.version!r}; install that version or fix arms.{self.label}.version"
            )
        # Without a log (an attached server with no `log`), `check` warns that the plugin cannot be verified.
        if arm.plugin is not None and self.log_path is not None and not self.plugin_logged():
            raise UserError(
                f"arm {self.label}: plugin {arm.plugin!r} is not active: no line of the server log "
                f"{self.log_path} contains {self.plugin_evidence()!r}; install/enable it or remove "
                f"arms.{self.label}.plugin"
            )

    def plugin_evidence(self) -> str:
        """The text a server log line must contain to show the plugin is active."""
        return self.arm.plugin_log_line or self.arm.plugin or ""

    def plugin_logged(self) -> bool:
        if self.arm.plugin is None or self.log_path is None:
            return False
        try:
            lines = self.log_path.read_text(errors="replace").lower().splitlines()
        except OSError:
            return False
        # our own header lines quote the command line, which names the plugin: only the server's lines count
        needle = self.plugin_evidence().lower()
        return any(needle in line for line in lines if not line.startswith(LOG_HEADER.lower()))

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None
