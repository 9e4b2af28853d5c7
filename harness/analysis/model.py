"""Typed results of the analysis: what summary.json / decision.json hold and what the report renders."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict

from harness.records.metric_registry import Direction


class Outcome(StrEnum):
    KEEP = "KEEP"
    REJECT = "REJECT"
    INCONCLUSIVE = "INCONCLUSIVE"
    INVALID = "INVALID"

    @property
    def exit_code(self) -> int:
        """`replaybench gate` exit status: 0 keep, 1 reject, 2 inconclusive, 3 invalid."""
        return list(Outcome).index(self)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True)


Role = Literal["target", "gate", "exploratory"]


class Estimator(StrEnum):
    """How one repeat's log-ratio of a metric is formed (the repeat is the replicate either way)."""

    REQUEST_PAIRED = "request-paired median log-ratio"  # median over requests of log(cand / base), same request
    RUN_QUANTILE = "per-run quantile ratio"  # log(candidate's quantile / baseline's), each over its own run
    RUN_RATIO = "per-run ratio"  # the same for a count metric (attainment, throughput, ...)


class MetricComparison(_Record):
    """Paired comparison of one metric over the valid repeats; ratios are candidate / baseline."""

    metric: str
    role: Role
    better: Direction
    estimator: Estimator
    margin: float | None  # δ for target/gate metrics
    baseline: list[float | None]  # one value per valid repeat (None: undefined, e.g. no successful request)
    candidate: list[float | None]
    ratio: float | None  # exp(mean paired log-ratio)
    ci_low: float | None
    ci_high: float | None
    verdict: str | None  # Verdict for target/gate; None for exploratory
    non_inferior: bool | None
    p_value: float | None  # two-sided, "no change"
    q_value: float | None  # Benjamini-Hochberg, exploratory only
    p_regression: float | None  # one-sided "worse by more than δ", Holm-adjusted over the decision family
    regression_flag: bool
    sd: float | None  # between-repeat sd of the per-repeat log-ratio: the noise this run showed
    note: str = ""


class SegmentComparison(_Record):
    """One exploratory paired comparison within a request segment (analysis/segments.py); candidate / baseline."""

    dimension: str  # "prompt", "output" (which trace length defines the segment) or "tenant"
    segment: str  # e.g. "prompt > 1,200 tokens", "tenant API log"
    metric: str  # a request-paired p50 (ttft_p50, tpot_p50)
    requests: int  # paired successful requests in the segment, fewest over the repeats
    ratio: float
    ci_low: float
    ci_high: float
    q_value: float  # "no change": Benjamini-Hochberg over every segment comparison of the run
    vs_whole: float  # the segment's ratio over the whole run's (the same estimator over every paired request)
    q_vs_whole: float  # "fares as the whole run": Benjamini-Hochberg over every segment comparison


class PlannedMetric(_Record):
    """One decision metric's part of KEEP in the planning calculation."""

    metric: str
    role: Role
    sd: float  # per-repeat sd of the log-ratio, as this run showed it
    assumed_change: float  # relative change assumed true: -planning effect for the target, 0 for a gate
    power: float  # P(its part of KEEP holds) at the repeats used: target CI beyond -δ, gate CI below +δ


class Planning(_Record):
    """Advice for the next run, NOT evidence: the chance that the rule actually applied says KEEP, by the
    non-central t at the noise this run showed, if the target truly improves by `assumed_effect` and the gate
    metrics are truly unchanged (metrics taken as independent)."""

    label: Literal["planning, not evidence"] = "planning, not evidence"
    repeats: int  # valid repeat pairs of this run
    power_goal: float
    assumed_effect: float | None  # relative improvement of the target assumed true (0.10: ratio 1 / 1.10)
    keep_power: float | None  # P(KEEP) at `repeats`
    repeats_needed: int | None  # fewest repeats with P(KEEP) >= power_goal (None: more than 100, or unknown)
    detectable_effect: float | None  # smallest true target improvement whose CI clears the margin with
    # probability power_goal at `repeats` (the target's part alone; the gates cap KEEP at `gate_power`)
    gate_power: float | None  # P(every gate non-inferior) at `repeats`, no true change
    sd_range: tuple[float, float] | None  # 95 % range of true sd / this run's sd, from `repeats` repeats
    metrics: list[PlannedMetric]
    line: str  # the whole advice in one sentence


LoadClass = Literal["below capacity", "near capacity", "past capacity", "unknown"]


class Detector(_Record):
    """One stability check, with the threshold that fires it and where that threshold comes from."""

    name: str
    value: float | None  # None: not computable here (too few repeats, no spread)
    threshold: float
    fires_below: bool  # True: fires when value < threshold
    fired: bool
    means: LoadClass | Literal["noise amplified", "drift"]  # what a firing detector says
    source: str


class RunStability(_Record):
    """Server-side stability of one run, from its per-request send and end times."""

    arm: str
    repeat: int
    arrival_span_s: float | None  # first to last scheduled arrival
    arrival_rate: float | None  # requests/s of the schedule
    completed_before_last_arrival: float | None  # share of all requests
    inflight_mean_second_half: float | None  # Little's law: requests between send and end, 2nd half mean
    backlog_growth: float | None  # slope of the in-flight count over the 2nd half / arrival rate
    load_share: float | None  # `replaybench.load_share` of the result file, if it carries one
    capacity_source: str | None = None  # `replaybench.capacity_source`: where the capacity behind it came from


class Trend(_Record):
    """A TPOT p50 trend over the repeats in run order, as the ratio of its value at the last repeat to the first."""

    ratio: float  # along the Theil-Sen line: one odd repeat cannot make it
    ci_low: float  # 95 % interval of the ratio, from the least-squares slope (t, repeats - 2 df)
    ci_high: float

    @property
    def steady(self) -> bool:
        """The interval holds no change: the trend may be noise."""
        return self.ci_low <= 1 <= self.ci_high


class Drift(_Record):
    """Did the servers slow down or speed up over the experiment? Trends of each arm and of their ratio."""

    baseline: Trend
    candidate: Trend | None  # None: the candidate's TPOT p50 is not positive in every repeat
    paired: Trend | None  # candidate / baseline: steady when the arms drifted alike (pairing cancels that)


class Stability(_Record):
    """Is the baseline near or past its capacity, where noise and effects are amplified? (summary.json)"""

    load_class: LoadClass
    load_share: float | None  # the baseline's load as a share of its capacity
    load_at_least: bool  # `load_share` is only a lower bound (estimated beyond the reference table)
    load_source: str  # where `load_share` comes from ("" when unknown)
    tpot_p50_elasticity: float | None  # % TPOT p50 change per 1 % step-time change at this load
    ttft_p50_elasticity: float | None
    suggested_load: float  # share of capacity to run at instead
    suggested_time_scale_factor: float | None  # multiply the time scale by this to get there
    suggested_time_scale: float | None
    detectors: list[Detector]
    runs: list[RunStability]
    banner: str | None  # the warning shown in the report; None when nothing points at capacity or drift
    # The load the runs' own completion share points at, by the review's table (None: not judged, or lighter
    # than its lightest row); `at_least`: only a lower bound. Set beside a declared load it may contradict.
    runs_load_share: float | None = None
    runs_load_at_least: bool = False
    drift: Drift | None = None  # None: fewer than DRIFT_MIN_REPEATS repeats with a TPOT p50

    @property
    def drifted(self) -> bool:
        return any(d.fired and d.means == "drift" for d in self.detectors)

    @property
    def headline(self) -> str:
        """The banner's title: the load class when it points at capacity, and the drift when that fired."""
        parts = [self.load_class] if self.load_class in ("near capacity", "past capacity") else []
        parts += ["servers drifted"] if self.drifted else []
        return "; ".join(parts).capitalize()


# The values a server cross-check puts side by side (client-measured / the server's own), in this order.
CHECK_FIELDS = (
    "ttft_mean_s",
    "tpot_mean_s",
    "itl_mean_s",
    "e2e_mean_s",
    "generated_tokens",
    "prompt_tokens",
    "requests",
    "preemptions",
    "prefix_cache_hit_rate",
)
SlowSide = Literal["client", "server"]


class ServerCheck(_Record):
    """One run's client-measured values beside the server's own (increase of its /metrics over the run)."""

    client: dict[str, float | None]  # CHECK_FIELDS; None where the client cannot tell (preemptions)
    server: dict[str, float | None]  # CHECK_FIELDS; None where the server's /metrics did not say
    missing: list[str]  # vLLM series absent from the server's /metrics
    notes: list[str]
    tpot_ratio: float | None  # client mean TPOT / server mean TPOT
    slow_side: SlowSide | None  # set when tpot_ratio is beyond [decision] server_tpot_tolerance
    warning: str  # "" unless slow_side is set


class ServerCheckMeans(_Record):
    """One arm's server cross-check: each value's mean over the arm's valid runs that have it."""

    runs: int
    client: dict[str, float | None]
    server: dict[str, float | None]
    flagged: int  # runs whose TPOT cross-check warned


class Speculation(_Record):
    """The speculative decoding an arm's server command line configures (`spec_config.py`)."""

    method: str | None = None
    tokens: int | None = None  # drafts k per verify step
    acceptance_length: float | None = None  # as configured (synthetic acceptance); None: the model decides
    note: str = ""


class SpecDecodeRun(_Record):
    """One run's decoding as its server counted it: increases of its /metrics series over the run, per second
    of the run's duration. Acceptance fields are None when the server drafted nothing (no speculation)."""

    configured: Speculation | None = None
    drafts: float | None = None  # verify steps of a request (vllm:spec_decode_num_drafts)
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    acceptance_length: float | None = None  # measured: 1 + accepted / drafts (vLLM's mean acceptance length)
    acceptance_rate: float | None = None  # accepted / draft tokens
    acceptance_by_position: list[float] = []  # accepted at draft position i / drafts
    engine_steps: float | None = None  # vllm:iteration_tokens_total observations: one per engine step
    engine_steps_per_s: float | None = None
    step_time_mean_s: float | None = None  # where the server exposes step durations (the embedded engine)
    emitted_throughput: float | None = None  # server-generated tokens / s
    processed_throughput: float | None = None  # emitted + rejected drafts, / s: tokens the target verified
    notes: list[str] = []


class AcceptanceCheck(_Record):
    """Did both arms decode with the same measured acceptance? Without it a speed verdict is refused."""

    acceptance_length: dict[str, float | None]  # arm -> 1 + Σ accepted / Σ drafts over its runs in the pairs
    configured: dict[str, float | None]  # arm -> AL its command line configures
    tolerance: float  # [decision] acceptance_tolerance
    matched: bool | None  # None: the gate does not apply (neither arm speculates, or only one does)
    line: str  # one sentence for the report; "" when neither arm speculates


class PrefixCacheCheck(_Record):
    """Did both arms' servers serve the same share of queried prompt tokens from their prefix cache? (a warning)"""

    hit_rate: dict[str, float | None]  # arm -> mean over its valid runs; None: its server does not count them
    tolerance: float  # [decision] prefix_cache_tolerance, in hit-rate points (0.05: 5 points)
    matched: bool | None  # None: not both arms counted
    line: str  # one sentence for the report; "" when neither server counts


class RunConditions(_Record):
    """What the machine did while one run replayed (experiment/telemetry.py), over its samples; None: not sampled."""

    samples: int  # host samples, one a second
    cpu_busy_mean_pct: float | None  # the host's CPU busy share, all cores, iowait not counted as busy
    cpu_steal_max_pct: float | None  # time a virtual machine's CPUs waited for the hypervisor: a noisy neighbour
    load1_max: float | None
    gpu_sm_mhz_mean: float | None  # the arm's GPUs, every sample
    gpu_sm_mhz_min: float | None
    gpu_max_sm_mhz: float | None  # the GPUs' own maximum SM clock
    gpu_power_w_mean: float | None
    gpu_temperature_c_max: float | None
    gpu_utilization_mean_pct: float | None
    gpu_error: str | None  # why the GPUs were not sampled, if they were not
    gpu_mem_mhz_min: float | None = None  # the memory clock's lowest sample (files from before it: None)
    gpu_memory_temperature_c_max: float | None = None  # HBM's hottest sample: HBM throttles when hot
    # the arm's server, from its load gauges (experiment/server_gauges.py); None: not sampled (files from before it,
    # or a server without vLLM's gauges, `server_error` saying why)
    server_samples: int = 0
    server_running_mean: float | None = None  # requests in the engine's batch
    server_waiting_mean: float | None = None  # requests queued for a place in it
    server_waiting_max: float | None = None
    server_kv_usage_max: float | None = None  # fraction of the KV cache's blocks in use, fullest sample
    server_error: str | None = None


class RunRow(_Record):
    """One (arm, repeat) run for the per-repeat table."""

    arm: str
    repeat: int
    file: str
    valid: bool
    reasons: list[str]
    warnings: list[str]  # fidelity warnings that do not invalidate the run (the server cross-check's)
    requests: int
    successes: int
    metrics: dict[str, float | None]
    failures: dict[str, int]
    lag_p50_ms: float | None
    lag_p99_ms: float | None
    lag_max_ms: float | None
    offered_rate: float | None
    achieved_rate: float | None
    output_mismatches: int
    duration_s: float
    time_scale: float | None  # trace time compression the run replayed at (< 1: faster than recorded)
    simulated: bool
    token_count_sources: dict[str, int] = {}  # how streamed tokens were counted -> requests (stream_parse)
    server_check: ServerCheck
    spec_decode: SpecDecodeRun = SpecDecodeRun()
    # The busiest replay worker's event-loop lateness and the highest worker CPU share; None: not measured
    # (a result file written before receive lag was, or by the virtual-time simulator), so not gated.
    receive_lag_p50_ms: float | None = None
    receive_lag_p99_ms: float | None = None
    receive_lag_max_ms: float | None = None
    client_cpu_share: float | None = None
    conditions: RunConditions | None = None  # host and GPU while it replayed; None: not sampled (older run dirs)
    request_id_prefix: str | None = None  # X-Request-Id = this + the quoted request id, for the server's log


class Attempt(BaseModel):
    """One entry of attempts.json (written by the experiment runner)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    arm: str
    repeat: int
    attempt: int = 0
    status: Literal["accepted", "retried", "crashed", "invalid"]
    reason: str = ""
    path: str | None = None
    final: bool | None = None  # True: this attempt's result is results/<arm>-r<k>.parquet


class ExcludedRepeat(_Record):
    repeat: int
    reasons: list[str]


class QualityTask(_Record):
    task_id: str
    kind: str
    baseline_passed: bool | None
    candidate_passed: bool | None
    identical: bool | None
    first_divergent_token: int | None


class QualitySummary(_Record):
    measured: bool
    tasks: list[QualityTask]
    baseline_pass_rate: float | None
    candidate_pass_rate: float | None
    identical_fraction: float | None
    violations: list[str]
    note: str = ""


class CostSummary(_Record):
    currency: str
    gpu_hour_price: float
    gpus_per_arm: int
    baseline_cost_per_success: float | None
    candidate_cost_per_success: float | None
    monthly_requests: float
    monthly_saving: float | None  # before operating cost
    monthly_net_saving: float | None
    setup_cost: float
    operating_cost_per_month: float
    break_even_months: float | None
    line: str
    baseline_energy_per_success_j: float | None = None  # mean over the valid repeats; None: not measured
    candidate_energy_per_success_j: float | None = None
    energy_line: str = ""  # energy per successful request: both arms' and the change, or why it was not measured


class CapacityEntry(_Record):
    model_config = ConfigDict(frozen=True, extra="allow")

    max_time_compression: float | None = None
    cost_per_success_at_capacity: float | None = None
    first_failing_compression: float | None = None  # the lightest probe that failed: the capacity's upper bound


class ReviewRequest(_Record):
    request_id: str
    metric: str
    baseline_s: float
    candidate_s: float
    ratio: float
    prompt_tokens: int | None
    output_tokens: int | None
    baseline_output: str | None
    candidate_output: str | None


class ReviewWindow(_Record):
    start_s: float
    end_s: float
    requests: int
    ttft_ratio: float
    e2e_ratio: float


class Decision(_Record):
    """The gate's answer and the one-sentence reason; `rule` states the pre-declared rule that produced it."""

    outcome: Outcome
    reason: str
    rule: str
    repeats_used: list[int]
    excluded: list[ExcludedRepeat]

    @property
    def exit_code(self) -> int:
        return self.outcome.exit_code


class Summary(_Record):
    """Everything machine-readable about a run directory (summary.json)."""

    run_dir: str
    experiment: str
    mode: str | None  # "A/A" (candidate = baseline: calibrates the noise floor) or "A/B"
    decision: Decision
    comparisons: list[MetricComparison]
    planning: Planning
    stability: Stability
    runs: list[RunRow]
    server_check: dict[str, ServerCheckMeans]  # arm -> client vs server means over its valid runs
    acceptance: AcceptanceCheck | None = None  # speculative decoding parity of the arms (None: older summary)
    prefix_cache: PrefixCacheCheck | None = None  # the arms' prefix-cache hit rates (None: older summary)
    segments: list[SegmentComparison] = []  # exploratory, by prompt and output length tercile
    quality: QualitySummary
    cost: CostSummary
    capacity: dict[str, CapacityEntry]
    review_requests: list[ReviewRequest]
    review_windows: list[ReviewWindow]
    environment: dict[str, object]
    failed_attempts: list[Attempt]  # every retried, crashed or invalid attempt, for the record
    simulated: bool
    notes: list[str]
    alpha: float
    # arm -> our numbers under `vllm bench serve` result names (mean over the valid repeats; analysis/vllm_aliases.py)
    vllm_aliases: dict[str, dict[str, float | None]]
