"""What one replay run is asked to do (`ReplayOptions`) and what it produced (`ReplayOutcome`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import UserError
from harness.records.fidelity import DEFAULT_LAG_BUDGET_S, DEFAULT_RATE_TOLERANCE, Fidelity
from harness.records.trace_schema import TRACE_API_VALUES


@dataclass(frozen=True)
class ReplayOptions:
    """Knobs of one replay; the defaults are an open-loop, streaming, output-length-forced replay."""

    api: str | None = None  # "completions" | "chat" for every request; None = each row's trace `api`
    time_scale: float = 1.0  # < 1 compresses the trace (0.5 = twice the rate)
    workers: int = 1  # sender processes sharing one t0 (round-robin shards)
    max_inflight: int | None = None  # None = open loop; a cap makes late sends count as client queueing
    seed: int = 0  # prompt synthesis seed: same trace + seed -> byte-identical request bodies
    model: str | None = None  # None = the trace's model if the server serves it, else the server's first model
    stream: bool = True
    # Ask for cumulative usage in every chunk (`stream_options.continuous_usage_stats`, vLLM and SGLang) so
    # tokens are counted by the server; off for servers that reject the field (then only the final usage).
    usage_per_chunk: bool = True
    lag_budget_s: float = DEFAULT_LAG_BUDGET_S
    rate_tolerance: float = DEFAULT_RATE_TOLERANCE
    save_outputs: bool = False  # keep generated text in `output_text`
    request_timeout_s: float = 600.0  # whole request, send to last byte
    read_timeout_s: float = 60.0  # longest silence between bytes before the request counts as a timeout
    queue_timeout_s: float | None = None  # longest wait for a --max-inflight slot (None = request_timeout_s)
    api_key: str | None = None  # sent as `Authorization: Bearer ...`, never stored
    extra_metadata: dict[str, str] = field(default_factory=dict)  # stamped into the result file

    def __post_init__(self) -> None:
        if self.api is not None and self.api not in TRACE_API_VALUES:
            raise UserError(f"--api must be one of {', '.join(TRACE_API_VALUES)} (got {self.api!r})")
        if self.time_scale <= 0:
            raise UserError(f"--time-scale must be > 0 (got {self.time_scale}); use 0.5 to double the rate")
        if self.workers < 1:
            raise UserError(f"--workers must be at least 1 (got {self.workers})")
        if self.max_inflight is not None and self.max_inflight < 1:
            raise UserError(f"--max-inflight must be at least 1 (got {self.max_inflight}); omit it for open loop")
        if self.lag_budget_s <= 0:
            raise UserError(f"--lag-budget-ms must be > 0 (got {self.lag_budget_s * 1e3:g})")
        if min(self.request_timeout_s, self.read_timeout_s, self.queue_timeout_s or 1.0) <= 0:
            raise UserError("timeouts must be > 0 seconds")


@dataclass(frozen=True)
class ReplayOutcome:
    """The result file of one run and how faithful the run was; `interrupted` runs have `complete=False`."""

    path: Path
    fidelity: Fidelity
    complete: bool
    interrupted: bool
    requests: int  # rows written (finished requests)
    scheduled: int  # requests the trace slice asked for
    errors: dict[str, int]  # error class -> count
