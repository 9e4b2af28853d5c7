"""The server's own load while a run replays: vLLM's running and waiting request gauges and its KV-cache usage,
read from `/metrics` every `[replay] server_gauges_s` beside the host and GPU samples (telemetry.py).

Why: the before/after snapshots give a run's counters, but a gauge read twice says nothing about the run between.
Sampled, they say whether the server queued requests (waiting above zero: the offered load met its capacity, so
latency includes queueing) and how full its batch and KV cache ran, per arm: where to look first when the arms'
latencies differ. Each read costs the server one `/metrics` render in its API server's event loop (vLLM 0.24's:
2.3 ms on a 2-core box, bench/results/bench_metrics_render.md), hence a read every 10 s by default, not every second.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

# vLLM's gauge -> the sample's key; running and waiting are summed over engines, KV-cache usage (a fraction of the
# cache's blocks, despite its name) is the fullest engine's.
SUMMED = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting"}
FULLEST = {"vllm:kv_cache_usage_perc": "kv_usage"}


def parse_gauges(text: str) -> dict[str, float]:
    """The load gauges in a `/metrics` text (those it has); ValueError for text that is not the exposition."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        key = SUMMED.get(family.name) or FULLEST.get(family.name)
        for sample in family.samples if key else ():
            if sample.name == family.name:
                merge = max if family.name in FULLEST else sum
                values[key] = merge((values.get(key, 0.0), float(sample.value)))
    return values


def scrape_gauges(metrics_url: str, timeout_s: float) -> tuple[dict[str, float] | None, str | None]:
    """(the gauges now, None) or (None, why not): a server without them is an error text, never an exception."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:
            values = parse_gauges(response.read().decode("utf-8", "replace"))
    except (urllib.error.URLError, OSError, ValueError) as error:
        return None, f"{metrics_url}: {error}"
    if not values:
        return None, f"{metrics_url} has no vLLM load gauges ({', '.join([*SUMMED, *FULLEST])})"
    return values, None
