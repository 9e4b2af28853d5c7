"""Server lifecycle on real processes: launch, readiness, logs, metrics, stop of the whole group, errors."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from harness.errors import UserError
from harness.servers import ServerProcess, ServerSpec, ServerStartError, free_port, scrape_metrics
from harness.servers.groups import group_alive
from tests.conftest import stray_servers

TOY = str(Path(__file__).with_name("toy_server.py"))


def toy_spec(*extra: str, port: int | None = None, timeout_s: float = 20.0, **kwargs: object) -> ServerSpec:
    port = port or free_port()
    return ServerSpec(
        label="baseline",
        argv=(sys.executable, TOY, str(port), *extra),
        port=port,
        ready_url=f"http://127.0.0.1:{port}/health",
        startup_timeout_s=timeout_s,
        stop_grace_s=2.0,
        **kwargs,
    )


def test_launch_ready_scrape_and_stop(tmp_path: Path) -> None:
    env_out = tmp_path / "env.txt"
    spec = toy_spec("--env-out", str(env_out), gpus=(2, 3), env={"TOY_VAR": "hello"})
    with ServerProcess(spec, tmp_path / "servers" / "baseline-r0.log") as server:
        server.wait_ready()
        pid = server.pid
        assert server.running() and stray_servers().keys() >= {pid}
        assert scrape_metrics(server.base_url, tmp_path / "before.prom")
        assert scrape_metrics(server.base_url, tmp_path / "after.prom")
    assert not group_alive(pid) and not server.running()
    assert env_out.read_text().splitlines() == ["2,3", "hello"]
    assert (tmp_path / "before.prom").read_text().startswith("toy_requests_total")
    after = int((tmp_path / "after.prom").read_text().split()[1])
    before = int((tmp_path / "before.prom").read_text().split()[1])
    assert after == before + 1
    log = (tmp_path / "servers" / "baseline-r0.log").read_text()
    assert log.startswith("=== replaybench ") and "toy server starting" in log


def test_stop_reaches_grandchildren_and_sigterm_ignorers(tmp_path: Path) -> None:
    spec = toy_spec("--spawn-child", "--ignore-term")
    server = ServerProcess(spec, tmp_path / "log")
    server.start()
    pid = server.pid
    try:
        server.wait_ready()
        assert len(stray_servers()) >= 2  # the server and its grandchild
    finally:
        server.stop()
    assert pid is not None and not group_alive(pid)
    assert stray_servers() == {}
    assert server.exit_code == -9  # SIGTERM was ignored, so SIGKILL ended it


def test_port_in_use_names_port_and_arm(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = ServerProcess(toy_spec(port=port), tmp_path / "log")
        with pytest.raises(UserError, match=rf"port {port} for arm baseline is already in use"):
            server.start()
    assert not server.running()


def test_exit_during_startup_quotes_log(tmp_path: Path) -> None:
    server = ServerProcess(toy_spec("--exit-code", "3"), tmp_path / "log")
    server.start()
    with pytest.raises(ServerStartError) as raised:
        server.wait_ready()
    message = str(raised.value)
    assert "exited with code 3 during start-up" in message
    assert "fatal: toy server cannot start (as asked)" in message and "\n" not in message
    assert server.exit_code == 3


def test_not_ready_in_time_is_stopped(tmp_path: Path) -> None:
    server = ServerProcess(toy_spec("--start-delay", "30", timeout_s=0.5), tmp_path / "log")
    server.start()
    with pytest.raises(ServerStartError, match=r"not ready at http://127\.0\.0\.1:\d+/health within 0\.5 s"):
        server.wait_ready()
    assert not server.running() and stray_servers() == {}


def test_missing_command_is_a_user_error(tmp_path: Path) -> None:
    port = free_port()
    spec = ServerSpec(
        label="candidate",
        argv=("no-such-server-binary", "--port", str(port)),
        port=port,
        ready_url=f"http://127.0.0.1:{port}/health",
    )
    with pytest.raises(UserError, match="arm candidate: command 'no-such-server-binary' not found"):
        ServerProcess(spec, tmp_path / "log").start()


def test_scrape_of_unreachable_server_writes_reason(tmp_path: Path) -> None:
    target = tmp_path / "m.prom"
    assert not scrape_metrics(f"http://127.0.0.1:{free_port()}", target, timeout_s=1.0)
    assert target.read_text().startswith("# replaybench: could not scrape")
