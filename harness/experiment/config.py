"""The experiment config (`experiment.toml`): everything an experiment does, declared before it runs.

Relative paths (trace, quality tasks, an arm's `cwd`) are relative to the config file. In an arm's
`command`, `{port}` becomes the arm's port and `{python}` the running Python interpreter. The analysis
tables `[slo]`, `[decision]`, `[cost]`, `[quality]` are `harness.records.decision_config` models.
See README, section "experiment", for an annotated example.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.errors import UserError
from harness.records.decision_config import CostConfig, DecisionConfig, QualityLimits, SloConfig

ARMS = ("baseline", "candidate")
ORDERS = ("abba", "simultaneous", "random")
PLACEMENTS = ("swap", "fixed")
# Arm keys that say *where* a server runs, not *how* it serves: they may differ in an A/A experiment.
PLACEMENT_KEYS = frozenset({"port", "gpus", "url", "ready_url", "log", "plugin_log_line"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


MAX_LOAD = 1.5  # a share of capacity beyond this is an overload test, not an operating point


class LoadBasis(_Strict):
    """How a `load` became a time scale; written by replaybench when it freezes the config, never by hand."""

    capacity_time_scale: float = Field(gt=0)  # the baseline's time scale at capacity (its heaviest passing probe)
    capacity_source: str  # the capacity.json it came from, or "probe" (measured first by this run)


class TraceSelection(_Strict):
    """Which requests to replay: a slice of a trace file, compressed in time by `time_scale` or to a `load`.

    `load` is a share of the baseline's capacity on this slice under the `[slo]` (0.65 = 65 %): the time scale
    becomes capacity's time scale / load, found from `capacity` (a capacity.json, or the run directory of a
    `replaybench capacity`) or from a quick probe of the baseline that `run` does first (`capacity_probe`: by
    replays, or in virtual time for an embedded-engine baseline), and frozen.
    """

    path: Path
    start_s: float = Field(default=0.0, ge=0)
    duration_s: float | None = Field(default=None, gt=0)
    limit: int | None = Field(default=None, ge=1)
    time_scale: float = Field(default=1.0, gt=0)  # < 1 compresses (0.5 = twice the rate)
    load: float | None = None
    capacity: Path | None = None
    # How `run` measures the capacity a `load` needs when no `capacity` is given: "replay" probes the baseline's
    # server; "virtual" simulates an embedded-engine baseline in virtual time (seconds instead of minutes).
    capacity_probe: Literal["replay", "virtual"] = "replay"
    load_basis: LoadBasis | None = None

    @model_validator(mode="after")
    def _load_or_time_scale(self) -> TraceSelection:
        if self.load is None and (self.capacity is not None or self.load_basis is not None):
            raise ValueError("`capacity` and `load_basis` only go with `load`; add `load = 0.65` or remove them")
        if self.capacity_probe == "virtual" and (self.load is None or self.capacity is not None):
            raise ValueError(
                '`capacity_probe = "virtual"` says how a `load` without `capacity` is measured; add `load = 0.65` '
                "and no `capacity`, or remove capacity_probe"
            )
        if self.load is None:
            return self
        if not 0 < self.load <= MAX_LOAD:
            raise ValueError(
                f"`load` = {self.load:g} must be above 0 and at most {MAX_LOAD:g} (a share of the baseline's "
                "capacity: 0.65 = 65 %); give e.g. load = 0.65"
            )
        if self.load_basis is None and "time_scale" in self.model_fields_set:
            raise ValueError(
                "give either `load` (a share of capacity) or `time_scale`, not both; remove time_scale "
                "(replaybench derives it from the capacity)"
            )
        return self

    @property
    def load_resolved(self) -> bool:
        """True once `load` has been turned into `time_scale` (always true without a `load`)."""
        return self.load is None or self.load_basis is not None


class ReplaySettings(_Strict):
    """How each arm is driven; the same for both arms so their requests are byte-identical."""

    # sender processes; "auto" sizes them from the trace's peak token-event rate (harness/replay/auto_workers.py)
    workers: Annotated[int, Field(ge=1)] | Literal["auto"] = 1
    seed: int = 0  # prompt synthesis seed
    max_inflight: int | None = Field(default=None, ge=1)
    warmup_requests: int = Field(default=4, ge=0)  # sent after readiness, outside the trace, not measured
    save_outputs: bool = False  # keep every generated text in the result files
    usage_per_chunk: bool = True  # stream_options.continuous_usage_stats: tokens counted by the server
    request_timeout_s: float = Field(default=600.0, gt=0)
    # How often the arm's server's load gauges are read from its /metrics while it replays (0: never). Not every
    # second: vLLM renders /metrics in its API server's event loop (prometheus_client; vLLM 0.24's 47 KB in 2.3 ms
    # on a 2-core box, bench/results/bench_metrics_render.md), which delays every stream's next chunk by that much;
    # at one read a second that is one ITL gap in ~100 at a 9 ms step, the ITL p99 the report shows; every 10 s, one
    # in ~1,000.
    server_gauges_s: float = Field(default=10.0, ge=0)


class ArmConfig(_Strict):
    """One arm: a `command` replaybench launches, or the `url` of a server already running.

    With `url`, nothing is launched; a `command` given alongside documents how that server was started
    (used by `replaybench check` for the settings diff and the model check).
    """

    command: list[str] | None = None
    url: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    cwd: Path | None = None  # working directory of the command (default: the config file's directory)
    port: int = Field(default=0, ge=0, le=65535)  # 0: a free port is picked when the run starts
    gpus: list[int] = Field(default_factory=list)  # -> CUDA_VISIBLE_DEVICES
    ready_url: str = "/health"  # a path on the server, or a full URL
    startup_timeout_s: float = Field(default=300.0, gt=0)
    stop_grace_s: float = Field(default=30.0, gt=0)
    model: str | None = None  # model name to request (None: the server's first model)
    api: Literal["completions", "chat"] | None = None  # None: each trace row's api
    version: str | None = None  # expected server version, checked against GET /version once it is up
    plugin: str | None = None  # a plugin that must show in the server log (e.g. "replayssm")
    # the text of the log line that proves it is active (default: its name); a server's echo of its own
    # command line names the plugin whether or not it loaded, so a line the plugin itself logs is stronger
    plugin_log_line: str | None = None
    log: Path | None = None  # the server log of a `url` arm, for the plugin check
    supports: list[str] = Field(default_factory=list)  # model architectures this server supports (checked)

    @model_validator(mode="after")
    def _command_or_url(self) -> ArmConfig:
        if self.command is None and self.url is None:
            raise ValueError("give either `command` (a server to launch) or `url` (a server already running)")
        if self.command is not None and not self.command:
            raise ValueError('`command` is empty; give the server\'s argv, e.g. ["vllm", "serve", ...]')
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"`url` must start with http:// or https:// (got {self.url!r})")
        return self

    @property
    def launched(self) -> bool:
        """True when replaybench starts and stops this server itself."""
        return self.url is None

    def policy_settings(self) -> dict[str, object]:
        """The settings that define how the server serves (placement keys excluded)."""
        return self.model_dump(exclude=set(PLACEMENT_KEYS), mode="json")


class Arms(_Strict):
    baseline: ArmConfig
    candidate: ArmConfig | Literal["baseline"]  # "baseline": an A/A run


class ExperimentConfig(_Strict):
    """A paired experiment. `mode` is derived: "A/A" when the candidate serves exactly like the baseline."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    repeats: int = Field(default=5, ge=1)
    order: Literal["abba", "simultaneous", "random"] = "abba"
    seed: int = 0  # for order = "random"
    restart_per_repeat: bool = True  # a fresh server for every arm and repeat
    # "swap": the arms exchange their `gpus` in odd repeats, so arm and GPU are not confounded
    placement: Literal["swap", "fixed"] = "swap"
    max_attempts: int = Field(default=3, ge=1)  # per arm and repeat, for crashed or invalid runs
    policy_change: list[str] = Field(default_factory=list)  # flags / env vars expected to differ
    quality_tasks: Path | None = None  # JSONL of quality tasks, run greedily after the replays
    mode: Literal["A/B", "A/A"] | None = None  # derived when omitted; checked when given
    trace: TraceSelection
    replay: ReplaySettings = ReplaySettings()
    arms: Arms
    slo: SloConfig = SloConfig()
    decision: DecisionConfig = DecisionConfig()
    cost: CostConfig = CostConfig()
    quality: QualityLimits = QualityLimits()

    @model_validator(mode="after")
    def _derive_mode(self) -> ExperimentConfig:
        same = self.arms.candidate == "baseline" or (
            self.arms.baseline.policy_settings() == self.arms.candidate.policy_settings()
        )
        derived = "A/A" if same else "A/B"
        if self.mode is not None and self.mode != derived:
            raise ValueError(
                f"mode = {self.mode!r} but the arms make this an {derived} experiment; "
                "remove `mode` (it is derived) or make the arms match it"
            )
        self.mode = derived
        return self

    @model_validator(mode="after")
    def _last_look_is_the_end(self) -> ExperimentConfig:
        looks = self.decision.looks
        if looks and looks[-1] != self.repeats:
            raise ValueError(
                f"[decision] looks end at {looks[-1]} repeats but repeats = {self.repeats}; make the last look "
                "the run's repeats"
            )
        return self

    @property
    def is_aa(self) -> bool:
        return self.mode == "A/A"

    def arm(self, name: str) -> ArmConfig:
        """The effective config of an arm (an A/A candidate is a copy of the baseline)."""
        if name == "candidate" and self.arms.candidate == "baseline":
            return self.arms.baseline
        return getattr(self.arms, name)

    def declared(self, table: str) -> bool:
        """Whether the config file itself set this table (rather than relying on defaults)."""
        return table in self.model_fields_set


def _describe(error: ValidationError, source: str) -> str:
    """The first problem as one line: the key as a TOML path, what is wrong, and the fix."""
    first = error.errors()[0]
    loc = [str(part) for part in first["loc"] if not str(part).startswith(("function-after", "literal["))]
    # `arms.candidate` is a union (table or "baseline"); drop pydantic's branch names from the path.
    loc = [part for part in loc if part != "ArmConfig"]
    key = ".".join(loc) or "(top level)"
    more = f" (+{len(error.errors()) - 1} more problem(s))" if len(error.errors()) > 1 else ""
    if first["type"] == "extra_forbidden":
        return f"{source}: unknown key `{key}`; remove it or fix its spelling (README, section experiment){more}"
    if first["type"] == "missing":
        return f"{source}: missing key `{key}`; add it (README, section experiment){more}"
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "value_error":  # our own validators name the fix already
        return f"{source}: `{key}`: {message}{more}"
    return f"{source}: `{key}`: {message}; fix that value{more}"


def _resolve_paths(config: ExperimentConfig, base: Path) -> ExperimentConfig:
    """Make relative paths absolute against the config file's directory, so the frozen copy works anywhere."""

    def absolute(path: Path | None) -> Path | None:
        return None if path is None else (path if path.is_absolute() else (base / path).resolve())

    updates: dict[str, object] = {
        "trace": config.trace.model_copy(
            update={"path": absolute(config.trace.path), "capacity": absolute(config.trace.capacity)}
        ),
        "quality_tasks": absolute(config.quality_tasks),
    }
    arms = {}
    for name in ARMS:
        arm = getattr(config.arms, name)
        if isinstance(arm, ArmConfig):
            arm = arm.model_copy(update={"cwd": absolute(arm.cwd) or base.resolve(), "log": absolute(arm.log)})
        arms[name] = arm
    updates["arms"] = Arms.model_construct(**arms)
    return config.model_copy(update=updates)


def parse_config(data: dict[str, object], source: str, base: Path) -> ExperimentConfig:
    """Validate a parsed TOML document; every problem is a one-line `UserError` naming the key."""
    try:
        config = ExperimentConfig.model_validate(data)
    except ValidationError as error:
        raise UserError(_describe(error, source)) from None
    return _resolve_paths(config, base)


def load_config(path: Path) -> ExperimentConfig:
    """Read and validate an experiment config file."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(
            f"{path}: no such experiment config; give the path of a .toml file (see configs/demo.toml)"
        ) from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise UserError(f"{path}: not a readable TOML file ({error}); fix the syntax") from None
    return parse_config(data, str(path), path.parent)


def with_ports(config: ExperimentConfig) -> ExperimentConfig:
    """Pick a free port for every launched arm that left `port = 0`; an A/A candidate gets its own table.

    Done once before the config is frozen, so every repeat (and a resumed run) uses the same ports.
    """
    from harness.servers import free_port

    arms = {}
    for name in ARMS:
        arm = config.arm(name)
        if arm.launched and arm.port == 0:
            arm = arm.model_copy(update={"port": free_port()})
        arms[name] = arm
    return config.model_copy(update={"arms": Arms.model_construct(**arms)})


def substitute(argv: list[str], port: int) -> tuple[str, ...]:
    """Fill the `{port}` and `{python}` placeholders of a command."""
    return tuple(part.replace("{port}", str(port)).replace("{python}", sys.executable) for part in argv)
