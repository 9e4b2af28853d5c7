"""The cost a `/metrics` read puts on a vLLM 0.24 API server: its own stat logger's registry, rendered as its
`/metrics` route renders it (timing script: bench/metrics_render_cost.py), on this CPU."""

from __future__ import annotations

from pathlib import Path

from bench.bench_builder import write_venv_rows

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "tests" / "replayssm" / "integration" / "nemotron_h_8b_config.json"  # the H200 runs' shape


def main() -> None:
    notes = (
        "vLLM 0.24's `PrometheusStatLogger` for one engine (every series it registers), a few TTFT and ITL "
        "observations so histograms hold values, rendered with prometheus_client's `generate_latest` as the "
        "`/metrics` route does, synchronously in the API server's event loop: each read of the server's load gauges "
        "([replay] server_gauges_s) delays every stream's next chunk by about this long. Median and p90 of 200 renders "
        "on this CPU; a server host's faster cores take less."
    )
    write_venv_rows("bench_metrics_render", "metrics_render_cost.py", CONFIG, "vLLM /metrics render time", notes)
