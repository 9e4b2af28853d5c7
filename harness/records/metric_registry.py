"""The one definition of every metric replaybench reports: formula, unit, timestamps, failures, and peers' meanings.

Analysis, the decision config, the report and the README all read metric names, units and the better
direction from here, so a metric is defined once. Peer texts say how `vllm bench serve`, GuideLLM and
AIPerf define the same name where they differ (from ../shared/research/peer_survey_2.md §3.3); `None`
means no difference is known. The README's definitions table is generated from `METRICS`
(`python -m harness.report.metric_table`).

Latency metrics are distributions: per arm per repeat they are reported as `<name>_<statistic>` for every
statistic in `STATISTICS` (e.g. `ttft_p99`, `tpot_mean`). Every other metric is one number per run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Direction = Literal["lower", "higher"]
Unit = Literal["s", "req/s", "tokens/s", "fraction", "currency"]

QUANTILES = {"p50": 0.50, "p90": 0.90, "p99": 0.99}
STATISTICS = ("mean", *QUANTILES)
STATISTICS_TEXT = (
    "one value per arm per repeat: the mean and np.quantile (linear) at p50, p90, p99 over the run's samples "
    "(successful requests, or their pooled gaps for itl and icl; gap quantiles come from a log histogram, "
    "within 0.25 %)"
)
VLLM_ALIASES_TEXT = (
    "each is the mean over the valid repeats (every run of the arm when no repeat pair is valid) of the per-run "
    "value; latencies in ms, `duration` in s, token totals over successful requests"
)


@dataclass(frozen=True)
class Peers:
    """How other tools define the same name where they differ from ours; None: no difference known."""

    vllm: str | None = None
    guidellm: str | None = None
    aiperf: str | None = None


@dataclass(frozen=True)
class Metric:
    """One metric, as the analysis computes it and the README documents it."""

    name: str
    title: str
    formula: str
    unit: Unit
    timestamps: str  # which recorded times the formula reads
    failures: str  # how failed requests enter
    better: Direction
    latency: bool  # a per-request or per-token distribution, summarised by STATISTICS
    peers: Peers
    vllm_name: str | None = None  # the name `vllm bench serve --save-result` uses for the same quantity


_SUCCESSFUL_ONLY = "excluded (successful requests only)"

METRICS: tuple[Metric, ...] = (
    Metric(
        name="ttft",
        title="Time to first token",
        formula="first token time − send time",
        unit="s",
        timestamps="`sent_s`; `token_times[0]`, the first streamed chunk carrying a generated token",
        failures=_SUCCESSFUL_ONLY,
        better="lower",
        latency=True,
        vllm_name="ttft",
        peers=Peers(
            vllm="from just before the POST to the first SSE event with `choices`, even one with empty text",
            guidellm="from the actual send to the first token iteration; reasoning models get a separate "
            "time to first output token",
            aiperf="to the first non-empty content response; its time to first output token excludes reasoning",
        ),
    ),
    Metric(
        name="tpot",
        title="Time per output token",
        formula="per request (last token time − first token time) / (output tokens − 1); none for 1 token",
        unit="s",
        timestamps="`token_times[0]`, `token_times[-1]`; `output_tokens` (server usage when available)",
        failures=_SUCCESSFUL_ONLY,
        better="lower",
        latency=True,
        vllm_name="tpot",
        peers=Peers(
            vllm="(e2el − ttft) / (n − 1) with n from server usage, so its end is the last `choices` chunk",
            guidellm="`time_per_output_token_ms` = (last token − request start) / n: the first token is included",
            aiperf="no metric of this name; its `inter_token_latency` is this per-request average",
        ),
    ),
    Metric(
        name="itl",
        title="Inter-token latency",
        formula="per token: a chunk carrying k tokens after a gap g adds k samples of g / k; pooled over requests",
        unit="s",
        timestamps="`token_times` (gaps between consecutive token-carrying chunks), `token_counts`",
        failures=_SUCCESSFUL_ONLY + "; an ITL SLO applies to each request's longest gap",
        better="lower",
        latency=True,
        vllm_name="itl",
        peers=Peers(
            vllm="one sample per gap between streamed chunks (our icl); equal to ours only when every chunk "
            "carries one token",
            guidellm="`inter_token_latency_ms` is a per-request average (last − first) / (n − 1), i.e. our tpot",
            aiperf="a per-request average (request latency − ttft) / (output tokens − first chunk's tokens); "
            "the per-chunk distribution is its `inter_chunk_latency`",
        ),
    ),
    Metric(
        name="icl",
        title="Inter-chunk latency",
        formula="one sample per gap between consecutive token-carrying chunks; pooled over requests",
        unit="s",
        timestamps="`token_times`",
        failures=_SUCCESSFUL_ONLY,
        better="lower",
        latency=True,
        peers=Peers(
            vllm="no such name: its `itl` is this",
            guidellm="no such metric",
        ),
    ),
    Metric(
        name="e2e",
        title="End-to-end latency",
        formula="time from the send until the whole response body has been read",
        unit="s",
        timestamps="`sent_s`; `e2e_s` (includes the stream's tail: the usage chunk and [DONE])",
        failures=_SUCCESSFUL_ONLY,
        better="lower",
        latency=True,
        vllm_name="e2el",
        peers=Peers(
            vllm="`e2el` ends at the last `choices` chunk; the usage chunk and [DONE] are excluded",
            guidellm="`request_latency`, request start to request end, in seconds",
            aiperf="`request_latency` ends at the final content response; its full-response variants end at "
            "HTTP completion",
        ),
    ),
    Metric(
        name="throughput",
        title="Request throughput",
        formula="successful requests / run duration (first intended send to the last response's end)",
        unit="req/s",
        timestamps="`intended_s`, `sent_s` + `e2e_s`",
        failures="excluded from the count",
        better="higher",
        latency=False,
        vllm_name="request_throughput",
        peers=Peers(vllm="`request_throughput` = completed requests / the benchmark's wall time"),
    ),
    Metric(
        name="output_throughput",
        title="Output token throughput",
        formula="output tokens of successful requests / run duration",
        unit="tokens/s",
        timestamps="`output_tokens`; `intended_s`, `sent_s` + `e2e_s`",
        failures="excluded from the count",
        better="higher",
        latency=False,
        vllm_name="output_throughput",
        peers=Peers(
            vllm="output tokens (server usage, else re-tokenised text) of completed requests / wall time",
            aiperf="also reported per user (`output_token_throughput_per_user`)",
        ),
    ),
    Metric(
        name="goodput",
        title="Goodput",
        formula="requests that succeeded and met every `[slo]` limit / run duration",
        unit="req/s",
        timestamps="those of ttft, tpot, e2e and each request's longest ITL gap; the run duration",
        failures="never good",
        better="higher",
        latency=False,
        vllm_name="request_goodput",
        peers=Peers(
            vllm="`request_goodput`: SLOs on ttft, tpot, e2el (ms); failed is not good; tpot counts as 0 when n ≤ 1",
            guidellm="errored requests do not conform, cancelled ones are excluded, undeterminable ones removed",
            aiperf="a good-request count, fraction and rate",
        ),
    ),
    Metric(
        name="slo_attainment",
        title="SLO attainment",
        formula="requests that succeeded and met every `[slo]` limit / all requests",
        unit="fraction",
        timestamps="those of ttft, tpot, e2e and each request's longest ITL gap",
        failures="counted as misses",
        better="higher",
        latency=False,
        peers=Peers(
            vllm="no such metric (goodput only)",
            guidellm="the conforming share; errored requests do not conform, cancelled ones are excluded",
            aiperf="its good-request fraction",
        ),
    ),
    Metric(
        name="failure_rate",
        title="Failure rate",
        formula="failed requests (error class, no complete body, or non-2xx status) / all requests",
        unit="fraction",
        timestamps="none; reads `error`, `status` and whether `e2e_s` is set",
        failures="the numerator",
        better="lower",
        latency=False,
        peers=Peers(vllm="a `failed` count, not a rate", guidellm="failures are reported separately by status"),
    ),
    Metric(
        name="cost_per_success",
        title="Cost per successful request",
        formula="run duration × `[cost] gpus_per_arm` / 3600 × `gpu_hour_price` / successful requests",
        unit="currency",
        timestamps="the run duration",
        failures="excluded from the count (they cost GPU time, earn nothing)",
        better="lower",
        latency=False,
        peers=Peers(vllm="no cost metric", guidellm="no cost metric", aiperf="no cost metric"),
    ),
)

BY_NAME = {metric.name: metric for metric in METRICS}
LATENCY_METRICS = tuple(metric.name for metric in METRICS if metric.latency)
RATE_METRICS = tuple(metric.name for metric in METRICS if not metric.latency)

# Every metric the analysis computes per arm per repeat, and which direction is better.
METRIC_DIRECTIONS: dict[str, Direction] = {
    **{f"{m}_{s}": BY_NAME[m].better for m in LATENCY_METRICS for s in STATISTICS},
    **{name: BY_NAME[name].better for name in RATE_METRICS},
}


def metric_of(name: str) -> Metric:
    """The definition behind a computed metric name such as `ttft_p99`, `tpot_mean` or `goodput`."""
    if name in BY_NAME and not BY_NAME[name].latency:
        return BY_NAME[name]
    kind, _, statistic = name.rpartition("_")
    if statistic in STATISTICS and kind in BY_NAME and BY_NAME[kind].latency:
        return BY_NAME[kind]
    raise KeyError(f"unknown metric {name!r}; choose one of {', '.join(METRIC_DIRECTIONS)}")
