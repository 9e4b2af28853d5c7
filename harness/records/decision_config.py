"""The analysis-relevant parts of an experiment config, declared before anything runs (DESIGN §6-7).

`ExperimentConfig` (harness/experiment) embeds these models under four TOML tables of `experiment.toml`;
analysis reads them back from the frozen copy in a run directory without importing the experiment layer.
Every model forbids unknown keys, so a typo is an error that names the key instead of a silent default.

    [slo]                          # per-request service-level objectives; a failed request is a miss
    ttft_s = 2.0                   # time to first token, seconds (omit a key to not constrain it)
    tpot_s = 0.10                  # time per output token after the first = (last - first token time) / (n - 1)
    itl_s = 0.5                    # longest silence between streamed chunks (a stall) allowed in a request
    e2e_s = 60.0                   # end-to-end latency
    attainment_target = 0.90       # fraction of requests that must meet every SLO (used for capacity)

    [decision]
    alpha = 0.05                   # two-sided level of every CI; KEEP and REJECT each err at most alpha/2
    target = { metric = "tpot_p50", margin = 0.05 }   # must improve by more than its margin
    gate = [                       # must not get worse by more than their margins (non-inferiority)
      { metric = "ttft_p99", margin = 0.15 },        # README "Default margins": passable at 5 repeats
      { metric = "slo_attainment", margin = 0.01 },   # failed requests count as misses
    ]
    exploratory = ["itl_p99", "e2e_p99", "throughput", "failure_rate"]   # Benjamini-Hochberg; never decide
    request_paired = true          # ttft/tpot/e2e p50: per repeat, the median over requests of
                                   # log(candidate / baseline) of the same request; false: ratio of per-run p50s
    min_repeats = 3                # fewer valid repeat pairs than this -> INVALID
    lag_budget_s = 0.002           # a run whose p99 send lag exceeds this is invalid
    receive_lag_budget_s = 0.005   # ... or whose busiest replay worker's loop runs later than this at p99
    rate_tolerance = 0.01          # ... or whose achieved rate misses the offered rate by more than this
    server_tpot_tolerance = 0.05   # warn (not invalid) when the client's mean TPOT is off the server's own by more
    acceptance_tolerance = 0.05    # speculative decoding: INVALID when the arms' measured acceptance lengths
                                   # differ by more than this (relative)
    prefix_cache_tolerance = 0.05  # warn when the arms' prefix-cache hit rates (server) differ by more (absolute)
    power = 0.8                    # planning: the chance of KEEP the next run should have ...
    planning_effect = 0.10         # ... if the target truly improves this much (default: twice its margin,
                                   # at least 5 %); planning is advice for the next run, not evidence
    looks = [3, 5, 8]              # optional: stop at the first of these repeat counts that decides (KEEP or
                                   # REJECT); every look at alpha / 3. The last must be the experiment's repeats

    [cost]
    gpu_hour_price = 3.50          # price of one GPU-hour (currency below)
    gpus_per_arm = 1
    currency = "USD"
    setup_cost = 0.0               # one-off cost of adopting the candidate (engineering, rollout)
    operating_cost_per_month = 0.0 # extra recurring cost of running the candidate
    monthly_requests = 0           # production requests per month, for the break-even line
    energy_price_per_kwh = 0.0     # shows the energy per successful request as money too (0: not)

    [quality]
    max_pass_rate_drop = 0.0       # allowed absolute drop of the candidate's task pass rate
    min_identical_fraction = 0.0   # share of tasks whose outputs must be byte-identical across arms
    required = false               # true: a run without quality results is INVALID

A margin δ is a fraction on the ratio scale: 0.05 means "worse by more than 5 %" is a ratio beyond 1.05 in
the bad direction, and "better by more than 5 %" beyond 1 / 1.05 in the good one (symmetric in log space).
Metric names, their definitions and which way is better are in `harness/records/metric_registry.py`.
"""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from harness.errors import UserError
from harness.records.fidelity import DEFAULT_LAG_BUDGET_S, DEFAULT_RECEIVE_LAG_BUDGET_S
from harness.records.metric_registry import DEFAULT_ACCEPTANCE_TOLERANCE, METRIC_DIRECTIONS, Direction

# How the pre-registered looks share alpha (DecisionConfig.look_spending).
LookSpending = Literal["obrien-fleming", "bonferroni"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SloConfig(_Strict):
    """Per-request SLO thresholds in seconds; `None` leaves that latency unconstrained."""

    ttft_s: float | None = Field(default=2.0, gt=0)
    tpot_s: float | None = Field(default=0.1, gt=0)
    itl_s: float | None = Field(default=None, gt=0)
    e2e_s: float | None = Field(default=None, gt=0)
    attainment_target: float = Field(default=0.9, gt=0, le=1)


class MetricRule(_Strict):
    """One decision metric with its margin δ (a fraction: 0.05 = 5 %) and the direction that is better."""

    metric: str
    margin: float = Field(default=0.05, ge=0, lt=1)
    direction: Direction | None = None  # None: the metric's natural direction from METRIC_DIRECTIONS

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, name: str) -> str:
        if name not in METRIC_DIRECTIONS:
            raise ValueError(f"unknown metric {name!r}; choose one of {', '.join(METRIC_DIRECTIONS)}")
        return name

    @property
    def better(self) -> Direction:
        return self.direction or METRIC_DIRECTIONS[self.metric]


class DecisionConfig(_Strict):
    """The pre-declared decision rule: one target metric, a gate family, exploratory metrics, and levels."""

    alpha: float = Field(default=0.05, gt=0, lt=0.5)
    target: MetricRule = MetricRule(metric="tpot_p50", margin=0.05)
    gate: tuple[MetricRule, ...] = (
        # ±15 %, not ±10 %: with the H200 A/A's noise an unchanged candidate passes ±10 % only 60 % of the time
        # at 5 repeats, ±15 % 89 % (README "Default margins").
        MetricRule(metric="ttft_p99", margin=0.15),
        MetricRule(metric="slo_attainment", margin=0.01),  # counts failures as misses
    )
    # failure_rate is a ratio of rare counts, far too noisy to gate on; slo_attainment covers failures instead.
    exploratory: tuple[str, ...] = (
        "ttft_p50",
        "itl_p50",
        "itl_p99",
        "tpot_p99",
        "e2e_p50",
        "e2e_p99",
        "throughput",
        "failure_rate",
        "cost_per_success",
        "energy_per_success",
    )
    request_paired: bool = True
    min_repeats: int = Field(default=3, ge=2)
    lag_budget_s: float = Field(default=DEFAULT_LAG_BUDGET_S, gt=0)
    receive_lag_budget_s: float = Field(default=DEFAULT_RECEIVE_LAG_BUDGET_S, gt=0)
    rate_tolerance: float = Field(default=0.01, gt=0, lt=1)
    # Client mean TPOT vs the server's (/metrics): beyond x (1 + tol) or below / (1 + tol) is a fidelity warning.
    server_tpot_tolerance: float = Field(default=0.05, gt=0, lt=1)
    # Speculative decoding: the arms' measured acceptance lengths (AL = 1 + accepted / drafts, pooled over the
    # valid repeats) may differ by at most this, relative, or no speed verdict is given. 5 %: emitted tokens/s
    # scale with AL at a fixed step time, so a gap this size could alone make up the default 5 % target margin
    # and no larger gap may pass; and it is far beyond sampling noise (the same integer synthetic AL is exact,
    # a fractional one varies by at most 0.5 / sqrt(drafts) absolute, under 1 % of AL 2-3 from 1,000 drafts),
    # while the failure it catches, text that loops after a replay bug, moved acceptance by tens of percent.
    acceptance_tolerance: float = Field(default=DEFAULT_ACCEPTANCE_TOLERANCE, gt=0, lt=1)
    # The arms' prefix-cache hit rates (server counters) may differ by this many points (absolute) before the report
    # warns that cache state, not policy, may explain a difference. 5 points: the same trace gives both arms the
    # same reusable prefixes, so a larger gap is a configuration or warm-up difference, not noise.
    prefix_cache_tolerance: float = Field(default=0.05, gt=0, lt=1)
    power: float = Field(default=0.8, gt=0, lt=1)
    planning_effect: float | None = Field(default=None, gt=0, lt=10)
    # Sequential repeats: the repeat counts, fixed before the run, at which `replaybench run` analyses and stops once
    # the verdict is KEEP or REJECT (the last is the experiment's `repeats`). Each look tests at a share of alpha
    # (`look_spending`), so stopping at whichever look decides keeps each wrong verdict's chance within alpha, where
    # analysing after every repeat and stopping at the first KEEP would not. () : one look, at the end.
    looks: tuple[int, ...] = ()
    # How alpha is shared over the looks: "obrien-fleming" spends little at the early looks and leaves the last one
    # nearly alpha (boundaries set for the t statistics, harness/analysis/look_levels.py); "bonferroni" tests every
    # look at alpha / len(looks), simpler and conservative (at looks 3, 5, 8: power 33 % where O'Brien-Fleming has
    # 47 % for a true effect of 0.8 repeat SDs).
    look_spending: LookSpending = "obrien-fleming"
    # The declared alpha when this copy is one look's rule (`at_level`); None on the rule as declared.
    _family_alpha: float | None = PrivateAttr(default=None)

    @field_validator("exploratory")
    @classmethod
    def _known_exploratory(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [n for n in names if n not in METRIC_DIRECTIONS]
        if unknown:
            raise ValueError(f"unknown metric(s) {', '.join(unknown)}; choose from {', '.join(METRIC_DIRECTIONS)}")
        return names

    @model_validator(mode="after")
    def _no_duplicates(self) -> DecisionConfig:
        gated = [self.target.metric, *(rule.metric for rule in self.gate)]
        if len(set(gated)) != len(gated):
            raise ValueError("a metric appears twice in target/gate; list each decision metric once")
        if set(self.exploratory) & set(gated):
            raise ValueError("a decision metric is also listed as exploratory; list it in one place only")
        if any(later <= earlier for earlier, later in itertools.pairwise(self.looks)):
            raise ValueError(f"looks {list(self.looks)} must increase; list the repeat counts in order")
        if self.looks and self.looks[0] < self.min_repeats:
            raise ValueError(
                f"the first look ({self.looks[0]} repeats) is below min_repeats ({self.min_repeats}), where every "
                "verdict is INVALID; start the looks at min_repeats or later"
            )
        if self.planning_effect is not None and self.planning_effect <= self.target.margin:
            raise ValueError(
                f"planning_effect {self.planning_effect:g} must exceed the target margin {self.target.margin:g} "
                "(KEEP needs the CI beyond the margin, so a smaller true effect is never kept)"
            )
        return self

    @property
    def assumed_effect(self) -> float:
        """The target's true relative improvement that planning assumes: declared, or twice the margin (≥ 5 %)."""
        return self.planning_effect or max(2 * self.target.margin, 0.05)

    def at_level(self, level: float) -> DecisionConfig:
        """The rule as one look applies it: its tests at `level`, the declared alpha kept as `family_alpha`."""
        look = self.model_copy(update={"alpha": level})
        look._family_alpha = self.family_alpha
        return look

    @property
    def family_alpha(self) -> float:
        """The alpha declared for the whole run, which the looks share (`alpha` is one look's level in a copy)."""
        return self.alpha if self._family_alpha is None else self._family_alpha

    @property
    def looks_text(self) -> str:
        """The looks as the report names them: "3, 5, 8"."""
        return ", ".join(map(str, self.looks))

    @property
    def decision_rules(self) -> tuple[MetricRule, ...]:
        """Target first, then the gate family: every metric that must be non-inferior."""
        return (self.target, *self.gate)


class CostConfig(_Strict):
    """Cost inputs: GPU price for cost per successful request, adoption costs for the break-even line."""

    gpu_hour_price: float = Field(default=3.5, ge=0)
    gpus_per_arm: int = Field(default=1, ge=1)
    currency: str = "USD"
    setup_cost: float = Field(default=0.0, ge=0)
    operating_cost_per_month: float = Field(default=0.0, ge=0)
    monthly_requests: float = Field(default=0.0, ge=0)
    # Price of a kWh, to show the energy per successful request as money (0: not shown). Apart from cost per
    # successful request, which prices GPU-hours (and may already include the power), and only where energy was
    # measured.
    energy_price_per_kwh: float = Field(default=0.0, ge=0)


class QualityLimits(_Strict):
    """Limits on the quality task results (quality.json); breaking one rejects the candidate."""

    max_pass_rate_drop: float = Field(default=0.0, ge=0, le=1)
    min_identical_fraction: float = Field(default=0.0, ge=0, le=1)
    required: bool = False


class AnalysisConfig(_Strict):
    """The four analysis tables of experiment.toml; every other table is the experiment layer's business."""

    slo: SloConfig = SloConfig()
    decision: DecisionConfig = DecisionConfig()
    cost: CostConfig = CostConfig()
    quality: QualityLimits = QualityLimits()


ANALYSIS_TABLES = tuple(AnalysisConfig.model_fields)
# Keys that frozen copies of older runs carry but that no longer mean anything: dropped when re-analysing.
RETIRED_DECISION_KEYS = ("bootstrap",)  # the two-stage block bootstrap, removed: it undercovered at 3-5 repeats


def describe_validation_error(error: ValidationError, source: str) -> str:
    """One line naming the first bad key (as a TOML path) and how to fix it."""
    first = error.errors()[0]
    key = ".".join(str(part) for part in first["loc"]) or "(top level)"
    if first["type"] == "extra_forbidden":
        return f"{source}: unknown key `{key}`; remove it or fix its spelling (see harness/records/decision_config.py)"
    return f"{source}: `{key}`: {first['msg']}; fix that value ({len(error.errors())} problem(s) in total)"


def analysis_config_from_mapping(data: dict[str, object], source: str) -> AnalysisConfig:
    """Validate the `[slo]`, `[decision]`, `[cost]`, `[quality]` tables of a parsed (frozen) TOML document."""
    tables = {k: v for k, v in data.items() if k in ANALYSIS_TABLES}
    if isinstance(tables.get("decision"), dict):
        tables["decision"] = {k: v for k, v in tables["decision"].items() if k not in RETIRED_DECISION_KEYS}
    try:
        return AnalysisConfig.model_validate(tables)
    except ValidationError as error:
        raise UserError(describe_validation_error(error, source)) from None


def load_analysis_config(path: Path) -> AnalysisConfig:
    """Read the analysis tables of a (frozen) experiment.toml; unreadable TOML is a one-line `UserError`."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise UserError(f"{path}: cannot read the experiment config ({error}); fix or restore the file") from None
    return analysis_config_from_mapping(data, str(path))
