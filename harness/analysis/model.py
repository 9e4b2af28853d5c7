"""Typed results of the analysis: what summary.json / decision.json hold and what the report renders."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict


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


class MetricComparison(_Record):
    """Paired comparison of one metric over the valid repeats; ratios are candidate / baseline."""

    metric: str
    role: Role
    better: Literal["lower", "higher"]
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
    mde: float | None  # minimum detectable relative effect at the configured power
    repeats_needed: int | None = None  # repeats that would detect a change of `margin` at this noise (None: >100)
    bootstrap_low: float | None  # two-stage block bootstrap CI (quantile metrics)
    bootstrap_high: float | None
    note: str = ""


class RunRow(_Record):
    """One (arm, repeat) run for the per-repeat table."""

    arm: str
    repeat: int
    file: str
    valid: bool
    reasons: list[str]
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
    load_share: float | None = None  # offered load as a share of the baseline's capacity (0.65 = 65 %)


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


class CapacityEntry(_Record):
    model_config = ConfigDict(frozen=True, extra="allow")

    max_time_compression: float | None = None
    cost_per_success_at_capacity: float | None = None


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
    runs: list[RunRow]
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
    load_share: float | None = None  # the load every effect was measured at, as a share of the baseline's capacity
