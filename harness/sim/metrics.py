"""Prometheus text for the simulated engine: vLLM's metric names (so the same scraper works on both) plus
`replaybench_sim_*` series for the step loop's own health, and `replaybench_simulated 1` so nobody mistakes it.

vLLM's per-request latency histograms (TTFT, ITL, per-request TPOT, E2E) are stamped from the true step
deadlines, the engine's own clock, where vLLM uses its engine core's step stamps (ITL, TPOT) and its API
server's receipt of them (TTFT, E2E): the server-side cross-check of a replay reads them like vLLM's.

Like vLLM 0.24 it counts engine steps in `vllm:iteration_tokens_total` (one observation per step: prompt
tokens computed plus tokens generated) and, under speculative decoding only, the `vllm:spec_decode_*`
counters: one draft per verify step of a request, k draft tokens each, the accepted ones in total and per
draft position (`position` label). The step's modelled duration is `replaybench_sim_step_duration_seconds`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from harness.sim.engine_core import StepResult

DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0)
LATENESS_BUCKETS = (1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2, 0.1)
# vLLM 0.24's bucket bounds for the same series (only the sums and counts are read by replaybench).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0)
TOKEN_GAP_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 240.0, 480.0, 960.0)
COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)  # vLLM 0.24's bounds
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

    def render(self, name: str, help_text: str, labels: str = "") -> list[str]:
        """Exposition lines; `labels` is the inside of a label set (`model_name="m"`), added to every sample."""
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        common, own = (f"{labels}," if labels else ""), (f"{{{labels}}}" if labels else "")
        cumulative = 0
        for bound, n in zip(self.buckets, self.counts, strict=True):
            cumulative += n
            lines.append(f'{name}_bucket{{{common}le="{bound}"}} {cumulative}')
        lines += [
            f'{name}_bucket{{{common}le="+Inf"}} {self.count}',
            f"{name}_sum{own} {self.total}",
            f"{name}_count{own} {self.count}",
        ]
        return lines


@dataclass
class _Stamps:
    arrival_s: float
    first_s: float | None = None
    last_s: float | None = None


@dataclass
class RequestLatencies:
    """vLLM's per-request histograms from step deadlines: TTFT at the first token, ITL per step, and per-request
    TPOT (0 for a request of one token, as vLLM observes it), E2E and generated tokens once it finishes."""

    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(TOKEN_GAP_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(TOKEN_GAP_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    generated: Histogram = field(default_factory=lambda: Histogram(COUNT_BUCKETS))
    stamps: dict[str, _Stamps] = field(default_factory=dict)

    def arrived(self, request_id: str, now_s: float) -> None:
        self.stamps[request_id] = _Stamps(now_s)

    def emitted(self, request_id: str, deadline_s: float) -> None:
        """Tokens of the request (one, or several under speculation), produced by the step ending at `deadline_s`."""
        stamps = self.stamps.get(request_id)
        if stamps is None:  # aborted while its last step ran
            return
        if stamps.last_s is None:
            self.ttft.observe(deadline_s - stamps.arrival_s)
            stamps.first_s = deadline_s
        else:
            self.itl.observe(deadline_s - stamps.last_s)
        stamps.last_s = deadline_s

    def finished(self, request_id: str, tokens: int) -> None:
        stamps = self.stamps.pop(request_id, None)
        if stamps is None or stamps.first_s is None or stamps.last_s is None:
            return
        self.tpot.observe((stamps.last_s - stamps.first_s) / (tokens - 1) if tokens > 1 else 0.0)
        self.e2e.observe(stamps.last_s - stamps.arrival_s)
        self.generated.observe(tokens)

    def dropped(self, request_id: str) -> None:
        """Aborted (the client left, or a stall was injected): no per-request TPOT or E2E."""
        self.stamps.pop(request_id, None)

    def render(self, labels: str) -> list[str]:
        return [
            *self.ttft.render("vllm:time_to_first_token_seconds", "Time to first token (step deadline).", labels),
            *self.itl.render("vllm:inter_token_latency_seconds", "Time between a request's steps.", labels),
            *self.tpot.render(
                "vllm:request_time_per_output_token_seconds", "Per request: decode time / (tokens - 1).", labels
            ),
            *self.e2e.render("vllm:e2e_request_latency_seconds", "Arrival to the last token's step.", labels),
            *self.generated.render("vllm:request_generation_tokens", "Generated tokens per request.", labels),
        ]


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
class SpecDecodeCounters:
    """vLLM's `vllm:spec_decode_*` counters: drafts (verify steps of a request), draft and accepted tokens."""

    spec_tokens: int
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.accepted_per_position = [0] * self.spec_tokens

    def observe(self, accepted: list[int]) -> None:
        self.drafts += len(accepted)
        self.draft_tokens += self.spec_tokens * len(accepted)
        self.accepted_tokens += sum(accepted)
        for count in accepted:
            for position in range(count):
                self.accepted_per_position[position] += 1

    def render(self, labels: str) -> list[str]:
        lines = []
        for name, value in (
            ("num_drafts", self.drafts),
            ("num_draft_tokens", self.draft_tokens),
            ("num_accepted_tokens", self.accepted_tokens),
        ):
            lines += [f"# TYPE vllm:spec_decode_{name} counter", f"vllm:spec_decode_{name}_total{{{labels}}} {value}"]
        lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{position}"}} {value}'
            for position, value in enumerate(self.accepted_per_position)
        ]
        return lines


@dataclass
class EngineMetrics:
    model_name: str
    spec_tokens: int = 0  # drafts per verify step; 0: no speculative decoding, no spec_decode series
    step_duration: Histogram = field(default_factory=lambda: Histogram(DURATION_BUCKETS))
    iteration_tokens: Histogram = field(default_factory=lambda: Histogram(ITERATION_BUCKETS))
    lateness: LagTracker = field(default_factory=LagTracker)  # step loop wake-up vs the step's deadline
    delivery: LagTracker = field(default_factory=LagTracker)  # token chunk written vs the step's deadline
    latencies: RequestLatencies = field(default_factory=RequestLatencies)
    generation_tokens: int = 0
    prompt_tokens: int = 0
    requests_finished: int = 0
    requests_rejected: int = 0
    injected_failures: int = 0
    injected_stalls: int = 0
    spec_decode: SpecDecodeCounters | None = None

    def __post_init__(self) -> None:
        self.spec_decode = SpecDecodeCounters(self.spec_tokens) if self.spec_tokens else None

    def observe_step(self, result: StepResult) -> None:
        """Count one finished engine step: its duration, tokens, finished requests and verify outcomes."""
        generated = sum(tokens for _, tokens in result.emitted)
        self.step_duration.observe(result.duration_s)
        self.iteration_tokens.observe(result.work.prefill_tokens + generated)
        self.generation_tokens += generated
        self.requests_finished += len(result.finished)
        if self.spec_decode is not None:
            self.spec_decode.observe(result.accepted)

    def render(self, running: int, waiting: int, memory_usage: float, preemptions: int) -> str:
        inner = f'model_name="{self.model_name}"'
        label = f"{{{inner}}}"
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
            *self.latencies.render(inner),
            *self.iteration_tokens.render("vllm:iteration_tokens_total", "Tokens per engine step.", inner),
            *(self.spec_decode.render(inner) if self.spec_decode else []),
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
