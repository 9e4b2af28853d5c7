"""What `replaybench record` was asked to do, parsed and checked before anything listens or writes."""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from yarl import URL

from harness.errors import UserError
from harness.records.trace_schema import REDACTION_MODES

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
}
_DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
DEFAULT_SESSION_HEADER = "x-session-id"
DEFAULT_TENANT_HEADER = "x-tenant-id"
DEFAULT_BLOCK_SIZE = 16
MAX_WORKERS = 64
AUTO_WORKERS_MAX = 4
CORES_PER_AUTO_WORKER = 4


@dataclass(frozen=True)
class RecordOptions:
    """Everything the recorder needs; built by `commands.record` from the command line."""

    upstream: URL
    host: str
    port: int
    output: Path
    redact: str = "none"
    rotate_s: float = 900.0
    max_body: int = 4 * 1024**2
    session_header: str = DEFAULT_SESSION_HEADER
    tenant_header: str = DEFAULT_TENANT_HEADER
    block_size: int = DEFAULT_BLOCK_SIZE
    drain_s: float = 10.0
    workers: int = 1


def _quantity(text: str, units: dict[str, float], what: str, example: str) -> float:
    match = _QUANTITY.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in units:
        raise UserError(f"{what} {text!r} is not understood; write it like {example}")
    return float(match.group(1)) * units[unit]


def parse_size(text: str, what: str = "--max-body") -> int:
    """'4MiB' -> 4194304; plain numbers are bytes."""
    size = int(_quantity(text, _SIZE_UNITS, what, "4MiB, 512KiB or 1000000"))
    if size < 1:
        raise UserError(f"{what} must be at least 1 byte (got {text!r})")
    return size


def parse_duration(text: str, what: str = "--rotate") -> float:
    """'15m' -> 900.0; plain numbers are seconds; '0' means never."""
    return _quantity(text, _DURATION_UNITS, what, "15m, 1h, 30s or 0 (never)")


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS tells, else all of them)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def auto_workers(cores: int) -> int:
    """`--workers auto`: one proxy process per 4 cores, at most 4 (so one below 8 cores). More processes on the
    port mean fewer chunks of other streams queued in each event loop ahead of a new request, which is what
    the added p99 TTFT is made of; the other cores stay free for the upstream and the clients of the same host."""
    return max(1, min(AUTO_WORKERS_MAX, cores // CORES_PER_AUTO_WORKER))


def parse_workers(text: str, cores: int) -> int:
    """'auto' -> auto_workers(cores); otherwise a whole number from 1 to MAX_WORKERS."""
    if text.strip().lower() == "auto":
        return auto_workers(cores)
    if not text.strip().isdigit() or not 1 <= int(text) <= MAX_WORKERS:
        raise UserError(
            f"--workers must be auto or a number between 1 and {MAX_WORKERS} (got {text!r}); about one per free core"
        )
    return int(text)


def parse_upstream(text: str) -> URL:
    url = URL(text.rstrip("/"))
    if url.scheme not in ("http", "https") or not url.host:
        raise UserError(
            f"--upstream {text!r} is not an http(s) URL; give the server's base URL, e.g. http://127.0.0.1:8000"
        )
    if url.query_string or url.fragment:
        raise UserError(f"--upstream {text!r} has a query or fragment; give only scheme, host, port and path")
    return url


def parse_listen(text: str, allow_remote: bool) -> tuple[str, int]:
    """'127.0.0.1:8080' -> ('127.0.0.1', 8080); a non-loopback host needs `allow_remote`."""
    host, sep, port_text = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise UserError(f"--listen {text!r} is not HOST:PORT; use e.g. 127.0.0.1:8080 (port 0 picks a free one)")
    if not allow_remote and not is_loopback(host):
        raise UserError(
            f"--listen {host} is not a loopback address, so other machines could reach the proxy; "
            "add --allow-remote if that is intended, or listen on 127.0.0.1"
        )
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_redaction(mode: str) -> str:
    if mode not in REDACTION_MODES:
        raise UserError(f"--redact {mode!r} is not a redaction mode; use one of {', '.join(REDACTION_MODES)}")
    return mode


def check_header_name(name: str, option: str) -> str:
    """A session/tenant header must be a real header name and never one that carries credentials."""
    from harness.record.secrets import is_secret_name

    if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name):
        raise UserError(f"{option} {name!r} is not a valid HTTP header name; use e.g. X-Session-Id")
    if is_secret_name(name):
        raise UserError(
            f"{option} {name!r} names a header that carries credentials, which are never recorded; "
            "choose a header that holds only an id"
        )
    return name.lower()
