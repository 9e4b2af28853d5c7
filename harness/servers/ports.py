"""Loopback ports: find a free one, and tell the user clearly when the one an arm needs is taken."""

from __future__ import annotations

import socket

from harness.errors import UserError


def free_port() -> int:
    """A port the OS just handed out; free now (another process could still take it before we do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int) -> bool:
    """True when binding the port on all interfaces fails, i.e. something already listens there.

    SO_REUSEADDR mirrors what servers themselves set, so a port only lingering in TIME_WAIT counts as free.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return True
    return False


def require_free_port(port: int, label: str) -> None:
    """Raise one clear `UserError` naming the port and the arm when the port is taken."""
    if port_in_use(port):
        raise UserError(
            f"port {port} for arm {label} is already in use; stop whatever listens there "
            f"(`ss -ltnp 'sport = :{port}'`) or set arms.{label}.port to another port (0 picks a free one)"
        )
