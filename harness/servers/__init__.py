"""Launching, health-checking, scraping and stopping inference servers (DESIGN §6).

`ServerProcess(ServerSpec(...), log_path)` starts a server in its own process group with its output in a
log file, `wait_ready()` polls its readiness URL, `stop()` ends the whole group (SIGTERM, then SIGKILL).
`cleanup` and `watchdog` make sure no server outlives replaybench, however replaybench ends.
"""

from harness.servers.health import probe, scrape_metrics, server_identity
from harness.servers.ports import free_port, port_in_use, require_free_port
from harness.servers.process import CHILD_MARKER, ServerProcess, ServerSpec, ServerStartError

__all__ = [
    "CHILD_MARKER",
    "ServerProcess",
    "ServerSpec",
    "ServerStartError",
    "free_port",
    "port_in_use",
    "probe",
    "require_free_port",
    "scrape_metrics",
    "server_identity",
]
