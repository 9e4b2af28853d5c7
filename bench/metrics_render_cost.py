"""How long vLLM 0.24's API server takes to render `/metrics`, run inside the vLLM CPU venv by bench_metrics_render.py.
Args: a dir with the model's config.json, the JSON file to write.

Why: replaybench reads the server's load gauges from `/metrics` while a run replays ([replay] server_gauges_s).
vLLM mounts prometheus_client's ASGI app, which renders the text synchronously in the API server's event loop, so
each read delays every stream's next chunk by the render's time. This builds vLLM's own stat logger (every series it
registers for one engine), observes some requests so the histograms hold values, and times the render.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from replayssm_patch.gpu.gdn_layer_check import prepare_cpu

prepare_cpu()
from prometheus_client import generate_latest  # noqa: E402
from vllm.v1.metrics.loggers import PrometheusStatLogger  # noqa: E402
from vllm.v1.metrics.prometheus import get_prometheus_registry  # noqa: E402

from replayssm_patch.gpu.layer_check import vllm_config  # noqa: E402

RENDERS = 200


def main(model: Path, out: Path) -> None:
    logger = PrometheusStatLogger(vllm_config(None, model, max_model_len=8192))
    for histogram in (logger.histogram_time_to_first_token, logger.histogram_inter_token_latency):
        for value in (0.004, 0.02, 0.3, 2.0):
            histogram[0].observe(value)
    registry = get_prometheus_registry()
    times = []
    for _ in range(RENDERS):
        started = time.perf_counter()
        text = generate_latest(registry)
        times.append(time.perf_counter() - started)
    samples = sum(1 for line in text.decode().splitlines() if line and not line.startswith("#"))
    median_ms = statistics.median(times) * 1e3
    row = {
        "render": "vLLM 0.24 PrometheusStatLogger, 1 engine, Nemotron-H-8B config",
        "size (KB)": round(len(text) / 1024, 1),
        "samples": samples,
        "median render (ms)": round(median_ms, 2),
        "p90 render (ms)": round(statistics.quantiles(times, n=10)[-1] * 1e3, 2),
        "event-loop share at one read / 10 s": f"{median_ms / 10_000:.3%}",
        "at one read / 1 s": f"{median_ms / 1_000:.2%}",
    }
    out.write_text(json.dumps([row]))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
