"""Prometheus text for the simulated engine: vLLM's metric names (so the same scraper works on both) plus
`replaybench_sim_*` series for the step loop's own health, and `replaybench_simulated 1` so nobody mistakes it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0)
LATENESS_BUCKETS = (1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2, 0.1)
LATENESS_WINDOW = 20_000
LATE_THRESHOLD_S = 1e-3


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        self.total += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                break

    def render(self, name: str, help_text: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        cumulative = 0
        for bound, n in zip(self.buckets, self.counts, strict=True):
            cumulative += n
            lines.append(f'{name}_bucket{{le="{bound}"}} {cumulative}')
        lines += [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.total}", f"{name}_count {self.count}"]
        return lines


@dataclass
class LagTracker:
    """Seconds past a deadline: histogram, recent-window quantiles, max, and how many exceeded 1 ms."""

    histogram: Histogram = field(default_factory=lambda: Histogram(LATENESS_BUCKETS))
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=LATENESS_WINDOW))
    max_s: float = 0.0
    over_threshold: int = 0

    def observe(self, lateness_s: float) -> None:
        self.histogram.observe(lateness_s)
        self.recent.append(lateness_s)
        self.max_s = max(self.max_s, lateness_s)
        self.over_threshold += lateness_s > LATE_THRESHOLD_S

    def quantile(self, q: float) -> float:
        return float(np.quantile(np.fromiter(self.recent, float), q)) if self.recent else 0.0

    def render(self, name: str, help_text: str) -> list[str]:
        return [
            *self.histogram.render(f"{name}_seconds", help_text),
            f"# HELP {name}_quantile_seconds {help_text} Quantiles over the last {LATENESS_WINDOW} samples.",
            f"# TYPE {name}_quantile_seconds gauge",
            *(f'{name}_quantile_seconds{{quantile="{q}"}} {self.quantile(q):.9f}' for q in (0.5, 0.9, 0.99)),
            f"# TYPE {name}_max_seconds gauge",
            f"{name}_max_seconds {self.max_s:.9f}",
            f"# TYPE {name}_over_1ms_total counter",
            f"{name}_over_1ms_total {self.over_threshold}",
        ]


@dataclass
class EngineMetrics:
    model_name: str
    step_duration: Histogram = field(default_factory=lambda: Histogram(DURATION_BUCKETS))
    lateness: LagTracker = field(default_factory=LagTracker)  # step loop wake-up vs the step's deadline
    delivery: LagTracker = field(default_factory=LagTracker)  # token chunk written vs the step's deadline
    generation_tokens: int = 0
    prompt_tokens: int = 0
    requests_finished: int = 0
    requests_rejected: int = 0
    injected_failures: int = 0
    injected_stalls: int = 0

    def render(self, running: int, waiting: int, memory_usage: float, preemptions: int) -> str:
        label = f'{{model_name="{self.model_name}"}}'
        lines = [
            "# HELP replaybench_simulated 1: this server is replaybench's SIMULATED engine, not a real GPU server.",
            "# TYPE replaybench_simulated gauge",
            "replaybench_simulated 1",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{label} {running}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{label} {waiting}",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{label} {memory_usage:.6f}",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{label} {self.generation_tokens}",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{label} {self.prompt_tokens}",
            "# TYPE vllm:num_preemptions_total counter",
            f"vllm:num_preemptions_total{label} {preemptions}",
            "# TYPE vllm:request_success_total counter",
            f"vllm:request_success_total{label} {self.requests_finished}",
            "# TYPE replaybench_sim_requests_rejected_total counter",
            f"replaybench_sim_requests_rejected_total {self.requests_rejected}",
            "# TYPE replaybench_sim_injected_failures_total counter",
            f"replaybench_sim_injected_failures_total {self.injected_failures}",
            "# TYPE replaybench_sim_injected_stalls_total counter",
            f"replaybench_sim_injected_stalls_total {self.injected_stalls}",
            *self.step_duration.render("replaybench_sim_step_duration_seconds", "Modelled duration of engine steps."),
            *self.lateness.render(
                "replaybench_sim_step_lateness", "How late the step loop woke after each step's absolute deadline."
            ),
            *self.delivery.render(
                "replaybench_sim_token_delivery_lag",
                "How long after its step's deadline each token chunk was written to the socket.",
            ),
        ]
        return "\n".join(lines) + "\n"
