"""Replay fidelity of one result table: did the client send every request when the trace said (DESIGN §4),
and could it read every answer as it came?

A run whose p99 send lag exceeds its budget, or whose achieved request rate misses the trace's offered rate
by more than the tolerance, did not reproduce the trace's load and must not be compared. A run whose worst
worker's event loop ran later than the receive-lag budget at p99 stamped its token times late: it measured
the client, not the server ("client-bound"). Replay computes this at the end of a run; analysis recomputes
it from the result file, so it lives here in the lowest layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from harness.records.worker_load import WorkerLoad

DEFAULT_LAG_BUDGET_S = 0.002
DEFAULT_RECEIVE_LAG_BUDGET_S = 0.005
DEFAULT_RATE_TOLERANCE = 0.01
CLIENT_BOUND = "client-bound"  # how the receive-lag reason starts
STARVED_CPU_SHARE = 0.5  # a late worker that used less than this share of a core was starved by the host


@dataclass(frozen=True)
class Fidelity:
    """Send timing, receive timing (per worker) and output lengths of one replay run; `valid` is False when any
    reason holds."""

    requests: int  # rows in the result table
    sent: int  # requests that left the client (sent_s not null)
    lag_p50_s: float | None
    lag_p99_s: float | None
    lag_max_s: float | None
    offered_rate: float | None  # requests/s the trace asks for
    achieved_rate: float | None  # requests sent / send span
    rate_error: float | None  # achieved / offered - 1
    output_mismatches: int  # successful requests whose streamed token count != expected_output_tokens
    client_queue_errors: int  # requests the client itself could not send (a --max-inflight cap)
    lag_budget_s: float
    rate_tolerance: float
    valid: bool
    reasons: tuple[str, ...]
    worker_loads: tuple[WorkerLoad, ...] | None = None  # None: receive lag not measured (an older file), not gated
    receive_lag_budget_s: float = DEFAULT_RECEIVE_LAG_BUDGET_S

    @property
    def busiest_worker(self) -> WorkerLoad | None:
        return busiest_worker(self.worker_loads)

    @property
    def receive_lag_p99_s(self) -> float | None:
        """The run's receive lag: its busiest worker's p99 (None: not measured)."""
        busiest = self.busiest_worker
        return None if busiest is None else busiest.receive_lag_p99_s


def busiest_worker(loads: Sequence[WorkerLoad] | None) -> WorkerLoad | None:
    """The worker with the highest p99 receive lag (None when not measured or no worker has samples)."""
    measured = [w for w in loads or () if w.receive_lag_p99_s is not None]
    return max(measured, key=lambda w: w.receive_lag_p99_s or 0.0) if measured else None


def offered_rate_of(intended_s: Sequence[float] | np.ndarray) -> float | None:
    """Requests per second of a schedule: n / span between first and last intended send (None if < 2)."""
    if len(intended_s) < 2:
        return None
    span = float(np.max(intended_s) - np.min(intended_s))
    return len(intended_s) / span if span > 0 else None


def replay_fidelity(
    table: pa.Table,
    offered_rate: float | None = None,
    lag_budget_s: float = DEFAULT_LAG_BUDGET_S,
    rate_tolerance: float = DEFAULT_RATE_TOLERANCE,
    worker_loads: Sequence[WorkerLoad] | None = None,
    receive_lag_budget_s: float = DEFAULT_RECEIVE_LAG_BUDGET_S,
) -> Fidelity:
    """Fidelity of a result table (RESULT_SCHEMA) and, when measured, of its workers' event loops.

    Achieved rate = sent requests / (last send - first send). `offered_rate` defaults to the trace's rate over
    the same requests (n / span of their `intended_s`), the same definition, so a perfect replay scores
    exactly the offered rate, also for an interrupted run that sent only part of the trace.
    `worker_loads` None (a file without them) leaves receive lag unknown and ungated.
    """
    sent_mask = pc.is_valid(table.column("sent_s"))
    sent_s = table.column("sent_s").filter(sent_mask).to_numpy(zero_copy_only=False).astype(float)
    lags = table.column("lag_s").filter(sent_mask).to_numpy(zero_copy_only=False).astype(float)
    if offered_rate is None:
        offered_rate = offered_rate_of(table.column("intended_s").filter(sent_mask).to_numpy(zero_copy_only=False))
    achieved = offered_rate_of(sent_s)
    rate_error = achieved / offered_rate - 1 if achieved is not None and offered_rate else None

    errors = table.column("error")
    ok = pc.is_null(errors)
    mismatched = pc.and_(ok, pc.not_equal(table.column("output_tokens"), table.column("expected_output_tokens")))
    mismatches = int(pc.sum(pc.fill_null(mismatched, False).cast(pa.int64())).as_py() or 0)
    queue_errors = int(pc.sum(pc.fill_null(pc.equal(errors, "client_queue"), False).cast(pa.int64())).as_py() or 0)

    p50, p99, lag_max = (float(v) for v in np.quantile(lags, [0.5, 0.99, 1.0])) if len(lags) else (None,) * 3
    reasons = []
    if table.num_rows == 0 or not len(lags):
        reasons.append("no request was sent")
    if p99 is not None and p99 > lag_budget_s:
        reasons.append(f"p99 send lag {p99 * 1e3:.2f} ms exceeds the {lag_budget_s * 1e3:g} ms budget")
    if rate_error is not None and abs(rate_error) > rate_tolerance:
        reasons.append(
            f"achieved rate {achieved:.3f} req/s misses the offered {offered_rate:.3f} req/s "
            f"by {rate_error * 100:+.2f} % (tolerance ±{rate_tolerance * 100:g} %)"
        )
    if queue_errors:
        reasons.append(f"{queue_errors} request(s) could not be sent by the client (--max-inflight cap)")
    loads = None if worker_loads is None else tuple(worker_loads)
    client_bound = _client_bound_reason(loads, receive_lag_budget_s)
    if client_bound:
        reasons.append(client_bound)
    return Fidelity(
        requests=table.num_rows,
        sent=len(lags),
        lag_p50_s=p50,
        lag_p99_s=p99,
        lag_max_s=lag_max,
        offered_rate=offered_rate,
        achieved_rate=achieved,
        rate_error=rate_error,
        output_mismatches=mismatches,
        client_queue_errors=queue_errors,
        lag_budget_s=lag_budget_s,
        rate_tolerance=rate_tolerance,
        valid=not reasons,
        reasons=tuple(reasons),
        worker_loads=loads,
        receive_lag_budget_s=receive_lag_budget_s,
    )


def _client_bound_reason(loads: tuple[WorkerLoad, ...] | None, budget_s: float) -> str | None:
    """The reason a run is client-bound (its busiest worker's p99 receive lag over budget), else None."""
    worst = busiest_worker(loads)
    if worst is None or worst.receive_lag_p99_s is None or worst.receive_lag_p99_s <= budget_s:
        return None
    late = sum(w.receive_lag_p99_s is not None and w.receive_lag_p99_s > budget_s for w in loads or ())
    cpu = "" if worst.cpu_share is None else f" at {worst.cpu_share * 100:.0f} % CPU"
    starved = worst.cpu_share is not None and worst.cpu_share < STARVED_CPU_SHARE
    fix = (
        "other processes on the host kept it off the CPU: give the replay idle cores"
        if starved
        else "use more replay workers (--workers N|auto, [replay] workers) or a lighter load"
    )
    return (
        f"{CLIENT_BOUND}: p99 receive lag {worst.receive_lag_p99_s * 1e3:.2f} ms on replay worker {worst.worker}"
        f"{cpu} exceeds the {budget_s * 1e3:g} ms budget ({late} of {len(loads or ())} worker(s) over it), so "
        f"token times were stamped late; {fix}"
    )
