"""The one definition of every metric replaybench reports: formula, unit, timestamps, failures, and peers' meanings.

Analysis, the decision config, the report and the README all read metric names, units and the better
direction from here, so a metric is defined once. Peer texts say how `vllm bench serve`, GuideLLM and
AIPerf define the same name where they differ (from ../shared/research/peer_survey_2.md §3.3); `None`
means no difference is known. The README's definitions table is generated from `METRICS`
(`python -m harness.report.metric_table`).

Server metrics (`source="server"`) come from the increase of the server's own `/metrics` counters over a run
(speculative decoding, engine steps: `harness/analysis/spec_decode.py`); summary.json holds them per run under
`runs[].spec_decode`. They are shown and gated on (acceptance parity), never compared as decision metrics.

Latency metrics are distributions: per arm per repeat they are reported as `<name>_<statistic>` for every
statistic in `STATISTICS` (e.g. `ttft_p99`, `tpot_mean`). Every other metric is one number per run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Direction = Literal["lower", "higher"]
Unit = Literal["s", "req/s", "tokens/s", "steps/s", "tokens", "fraction", "currency", "J"]
Source = Literal["client", "server", "telemetry"]

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
    # client: from the result files; server: from its /metrics counters; telemetry: from the GPUs sampled beside
    # the run (harness/experiment/telemetry.py)
    source: Source = "client"


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
    Metric(
        name="energy_per_success",
        title="Energy per successful request",
        formula="Σ over the arm's GPUs (NVML energy counter at the window's end − at its start; else mean sampled "
        "board power × run duration) / successful requests",
        unit="J",
        timestamps="the run's window on the wall clock (`replaybench.t0_unix` + first due request to last end); "
        "each GPU's NVML energy counter read once a second and at the run's ends, interpolated to the window; where "
        "it was not read, `power.draw` sampled once a second by nvidia-smi (telemetry/) inside the window (for a "
        "window shorter than that, the samples one second either side)",
        failures="excluded from the count (they draw power, earn nothing); none when the arm has no `gpus` or "
        "its GPUs were not sampled",
        better="lower",
        latency=False,
        source="telemetry",
        peers=Peers(vllm="no energy metric", guidellm="no energy metric", aiperf="GPU energy, not per request"),
    ),
)

_SPEC_COUNTERS = "increase of `vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens`"
_NO_REQUESTS = "not per request: counted by the server over the run (aborted requests included)"
_NOT_SPECULATING = "none without speculative decoding"
# [decision] acceptance_tolerance's default (its reasons are in decision_config.py): the relative gap of measured
# acceptance lengths beyond which no speed verdict is given; also replayssm_patch/gpu/spec_step.py's AL check.
DEFAULT_ACCEPTANCE_TOLERANCE = 0.05

METRICS += (
    Metric(
        name="acceptance_length",
        title="Acceptance length (measured)",
        formula="1 + accepted tokens / drafts (a draft: one verify step of one request); the bonus token included",
        unit="tokens",
        timestamps=f"none; {_SPEC_COUNTERS} between the /metrics scrapes around the run",
        failures=_NO_REQUESTS,
        better="higher",
        latency=False,
        source="server",
        peers=Peers(vllm="`vllm bench serve`'s `spec_decode_acceptance_length`, the same formula over its run"),
    ),
    Metric(
        name="acceptance_rate",
        title="Draft acceptance rate",
        formula="accepted tokens / draft tokens",
        unit="fraction",
        timestamps=f"none; {_SPEC_COUNTERS}",
        failures=_NO_REQUESTS,
        better="higher",
        latency=False,
        source="server",
        peers=Peers(vllm="`spec_decode_acceptance_rate` in percent"),
    ),
    Metric(
        name="acceptance_by_position",
        title="Acceptance per draft position",
        formula="per draft position i: accepted tokens at i / drafts (unconditional: drafts 0..i all accepted)",
        unit="fraction",
        timestamps="none; increase of `vllm:spec_decode_num_accepted_tokens_per_pos` per `position` label",
        failures=_NO_REQUESTS,
        better="higher",
        latency=False,
        source="server",
        peers=Peers(vllm="`spec_decode_per_position_acceptance_rates`"),
    ),
    Metric(
        name="engine_steps_per_s",
        title="Engine steps per second",
        formula="engine steps / run duration; a step: one observation of `vllm:iteration_tokens_total`",
        unit="steps/s",
        timestamps="the run duration; the histogram's `_count` increase",
        failures=_NO_REQUESTS,
        better="higher",
        latency=False,
        source="server",
        peers=Peers(vllm="not reported by `vllm bench serve`"),
    ),
    Metric(
        name="step_time_mean",
        title="Mean engine step time",
        formula="sum / count of the server's step-duration histogram; only where it exposes one (serve-sim)",
        unit="s",
        timestamps="`replaybench_sim_step_duration_seconds` (vLLM 0.24 exposes no step duration)",
        failures=_NO_REQUESTS,
        better="lower",
        latency=False,
        source="server",
        peers=Peers(vllm="not reported"),
    ),
    Metric(
        name="emitted_throughput",
        title="Emitted token throughput (server)",
        formula="generated tokens the server counted / run duration",
        unit="tokens/s",
        timestamps="the run duration; increase of `vllm:generation_tokens_total`",
        failures=_NO_REQUESTS,
        better="higher",
        latency=False,
        source="server",
        peers=Peers(vllm="its `output_throughput` counts completed requests' tokens at the client"),
    ),
    Metric(
        name="processed_throughput",
        title="Processed token throughput (server)",
        formula="(generated tokens + draft tokens − accepted tokens) / run duration: what the target verified; "
        f"equals emitted throughput {_NOT_SPECULATING}",
        unit="tokens/s",
        timestamps="the run duration; increases of the generation and spec-decode counters",
        failures=_NO_REQUESTS,
        better="higher",
        latency=False,
        source="server",
        peers=Peers(vllm="not reported"),
    ),
)

BY_NAME = {metric.name: metric for metric in METRICS}
LATENCY_METRICS = tuple(metric.name for metric in METRICS if metric.latency)
RATE_METRICS = tuple(metric.name for metric in METRICS if not metric.latency and metric.source != "server")

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
