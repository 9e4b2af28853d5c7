"""The one-screen summary printed after a replay: outcome counts, fidelity verdict, latency percentiles."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Group
from rich.table import Table
from rich.text import Text

from harness.records.fidelity import Fidelity
from harness.replay.options import ReplayOutcome

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class LatencyPercentiles:
    """Seconds at PERCENTILES over successful requests; None when nothing was measured."""

    name: str
    values: tuple[float, ...] | None
    samples: int


def _percentiles(name: str, values: np.ndarray) -> LatencyPercentiles:
    values = values[np.isfinite(values)]
    if not len(values):
        return LatencyPercentiles(name, None, 0)
    return LatencyPercentiles(name, tuple(float(v) for v in np.percentile(values, PERCENTILES)), len(values))


def latency_percentiles(table: pa.Table) -> list[LatencyPercentiles]:
    """TTFT, ITL (every gap between token chunks), TPOT = (e2e - ttft) / (n - 1), E2E."""
    ok = table.filter(pc.is_null(table.column("error")))
    ttft = ok.column("ttft_s").to_numpy(zero_copy_only=False).astype(float)
    e2e = ok.column("e2e_s").to_numpy(zero_copy_only=False).astype(float)
    gaps = [np.diff(np.asarray(t, dtype=float)) for t in ok.column("token_times").to_pylist() if t]
    counts = ok.column("output_tokens").to_numpy(zero_copy_only=False).astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(counts > 1, (e2e - ttft) / (counts - 1), np.nan)
    itl = np.concatenate(gaps) if gaps else np.array([])
    return [_percentiles("TTFT", ttft), _percentiles("ITL", itl), _percentiles("TPOT", tpot), _percentiles("E2E", e2e)]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.2f} ms"


def receive_lag_line(f: Fidelity) -> str:
    """The busiest worker's event-loop lateness and the highest CPU share, or why they are unknown."""
    busiest = f.busiest_worker
    if f.worker_loads is None:
        return "receive lag: unknown (not measured: the result file predates it); not gated"
    if busiest is None:
        return "receive lag: no samples (the workers stopped before their first tick); not gated"
    shares = [w.cpu_share for w in f.worker_loads or () if w.cpu_share is not None]
    cpu = f"; CPU share max {max(shares) * 100:.0f} %" if shares else ""
    return (
        f"receive lag: p50 {_ms(busiest.receive_lag_p50_s)}, p99 {_ms(busiest.receive_lag_p99_s)}, "
        f"max {_ms(busiest.receive_lag_max_s)} on the busiest of {len(f.worker_loads or ())} worker(s) "
        f"(budget {f.receive_lag_budget_s * 1e3:g} ms){cpu}"
    )


def render_summary(outcome: ReplayOutcome, table: pa.Table) -> Group:
    f = outcome.fidelity
    verdict = Text("VALID", style="bold green") if f.valid and outcome.complete else Text("INVALID", style="bold red")
    errors = ", ".join(f"{k} {v}" for k, v in sorted(outcome.errors.items())) or "none"
    lines = [
        Text.assemble("replay ", verdict, f"  ->  {outcome.path}"),
        Text(
            f"requests: {outcome.requests} finished of {outcome.scheduled} scheduled"
            f"{'' if outcome.complete else '  (INCOMPLETE: interrupted)'}; errors: {errors}"
        ),
        Text(
            f"send lag: p50 {_ms(f.lag_p50_s)}, p99 {_ms(f.lag_p99_s)}, max {_ms(f.lag_max_s)} "
            f"(budget {f.lag_budget_s * 1e3:g} ms)"
        ),
        Text(
            "rate: achieved "
            + ("-" if f.achieved_rate is None else f"{f.achieved_rate:.3f}")
            + " req/s vs offered "
            + ("-" if f.offered_rate is None else f"{f.offered_rate:.3f}")
            + " req/s"
            + ("" if f.rate_error is None else f" ({f.rate_error * 100:+.3f} %)")
        ),
        Text(receive_lag_line(f)),
        Text(f"output-length mismatches: {f.output_mismatches}"),
    ]
    lines += [Text(f"invalid: {reason}", style="red") for reason in f.reasons]
    latency = Table(title="latency of successful requests", title_justify="left")
    latency.add_column("metric")
    for p in PERCENTILES:
        latency.add_column(f"p{p}", justify="right")
    latency.add_column("samples", justify="right")
    for row in latency_percentiles(table):
        values = row.values or (None,) * len(PERCENTILES)
        latency.add_row(row.name, *(_ms(v) for v in values), str(row.samples))
    return Group(*lines, latency)
