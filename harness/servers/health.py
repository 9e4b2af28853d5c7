"""Talking to a running server over HTTP: readiness polling and Prometheus `/metrics` scrapes.

Plain `urllib` on purpose: these are a handful of blocking calls between replays, no event loop needed.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from harness.atomic import atomic_path


def probe(url: str, timeout_s: float = 2.0) -> int | None:
    """HTTP status of a GET, or None when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def poll_ready(
    url: str, timeout_s: float, still_starting: Callable[[], bool] = lambda: True, interval_s: float = 0.1
) -> bool:
    """Poll `url` until it answers 200 (True), `timeout_s` passes or `still_starting()` turns False (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if probe(url) == 200:
            return True
        if not still_starting():
            return False
        time.sleep(interval_s)
    return False


def scrape_metrics(base_url: str, target: Path, timeout_s: float = 5.0) -> bool:
    """Save `base_url`/metrics as text; a server without metrics gets a comment saying why (never fails a run)."""
    url = base_url.rstrip("/") + "/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            text, ok = response.read().decode("utf-8", "replace"), True
    except (urllib.error.URLError, OSError, ValueError) as error:
        text, ok = f"# replaybench: could not scrape {url}: {error}\n", False
    with atomic_path(target) as tmp:
        tmp.write_text(text)
    return ok


def get_json(url: str, timeout_s: float = 5.0) -> object | None:
    """The decoded JSON body of a GET, or None when the server has no such endpoint or did not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def server_identity(base_url: str) -> dict[str, object]:
    """What a server says about itself: `version` (GET /version, as vLLM serves it) and `models` (/v1/models)."""
    version = get_json(base_url.rstrip("/") + "/version")
    models = get_json(base_url.rstrip("/") + "/v1/models")
    entries = models.get("data", []) if isinstance(models, dict) else []
    return {
        "version": version.get("version") if isinstance(version, dict) else None,
        "models": [entry.get("id") for entry in entries if isinstance(entry, dict)],
        "owned_by": sorted({str(entry.get("owned_by")) for entry in entries if isinstance(entry, dict)}),
    }
