"""One result file (one arm, one repeat) -> its metrics, per-request table and per-block latency histograms.

Everything is vectorised over requests; streamed token times are reduced to inter-token gaps with Arrow
list offsets, and only histograms of them are kept (a run can hold tens of millions of gaps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from harness.analysis.energy import RunEnergy, run_energy
from harness.analysis.log_histogram import block_histograms, quantiles_from_counts
from harness.records.decision_config import CostConfig, DecisionConfig, SloConfig
from harness.records.fidelity import Fidelity, replay_fidelity
from harness.records.metric_registry import LATENCY_METRICS, QUANTILES
from harness.records.result_io import read_results
from harness.records.result_schema import (
    META_ARM,
    META_OFFERED_RATE,
    META_REPEAT,
    META_REQUEST_ID_PREFIX,
    META_SIMULATED,
    META_T0_UNIX,
    META_TIME_SCALE,
)
from harness.records.worker_load import loads_from_meta

REQUEST_COLUMNS = (
    "request_id",
    "intended_s",
    "sent_s",
    "lag_s",
    "status",
    "error",
    "ttft_s",
    "e2e_s",
    "output_tokens",
    "expected_output_tokens",
    "prompt_tokens",
    "tenant",
)


@dataclass(frozen=True)
class TimeBlocks:
    """The common time-block grid of a whole run directory (same trace for every arm and repeat)."""

    start_s: float
    block_s: float
    count: int

    def of(self, intended_s: np.ndarray) -> np.ndarray:
        return np.clip(((intended_s - self.start_s) // self.block_s).astype(np.int64), 0, self.count - 1)


@dataclass
class RunMetrics:
    """Everything the paired analysis and the report need from one run; the raw table is not kept."""

    arm: str
    repeat: int
    path: Path
    simulated: bool
    time_scale: float | None
    requests: pd.DataFrame  # one row per request, with derived tpot_s, max_itl_s, ok, slo_met, block
    metrics: dict[str, float]  # true values, as shown
    # The same, but a zero count taken as half a request so log-ratios stay finite: an arm that meets no SLO
    # is a regression, not an undefined one. Equal to `metrics` whenever every count is at least one.
    comparable: dict[str, float]
    failures: dict[str, int]
    token_count_sources: dict[str, int]  # source (CONTINUOUS_USAGE, ...) -> requests counted that way
    fidelity: Fidelity
    duration_s: float
    histograms: np.ndarray  # int32 (len(LATENCY_METRICS), blocks, BINS)
    energy: RunEnergy  # of the arm's GPUs over the run's window
    request_id_prefix: str | None  # its requests' X-Request-Id is this + the quoted request id (None: older file)


def _numpy_column(table: pa.Table, name: str) -> np.ndarray:
    """Numbers as float64 with NaN for null (so integer columns with nulls vectorise); anything else as is."""
    column = table.column(name)
    if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        column = pc.fill_null(column.cast(pa.float64()), math.nan)
    return column.to_numpy(zero_copy_only=False)


@dataclass(frozen=True)
class ChunkGaps:
    """Gaps between consecutive streamed chunks of each request (ICL samples)."""

    gaps: np.ndarray  # float32
    rows: np.ndarray  # int64, sorted
    tokens: np.ndarray  # int64, tokens carried by the chunk that ends each gap

    def per_token(self) -> tuple[np.ndarray, np.ndarray]:
        """Inter-token latency (ITL): a chunk of k tokens after a gap g stands for k tokens g/k apart."""
        tokens = np.maximum(self.tokens, 1)
        return np.repeat((self.gaps / tokens).astype(np.float32), tokens), np.repeat(self.rows, tokens)


@dataclass(frozen=True)
class TokenTiming:
    """Flattened streamed chunks of a run: arrival times, tokens per chunk and the row each belongs to."""

    times: np.ndarray  # float32, as stored
    tokens: np.ndarray  # int64, tokens carried by each chunk (1 where the file has no per-chunk counts)
    rows: np.ndarray  # int64, sorted (Arrow list parents)

    @classmethod
    def of(cls, table: pa.Table) -> TokenTiming:
        times = table.column("token_times").combine_chunks()
        counts = table.column("token_counts").combine_chunks()
        values = pc.list_flatten(times).to_numpy(zero_copy_only=False)
        rows = pc.list_parent_indices(times).to_numpy(zero_copy_only=False).astype(np.int64)
        tokens = np.ones(len(values), np.int64)
        # Per-chunk counts are used where a row has one per chunk (always, in files this version writes).
        matching = pc.fill_null(pc.equal(pc.list_value_length(counts), pc.list_value_length(times)), False)
        matching = matching.to_numpy(zero_copy_only=False)
        if matching.any():
            counted = pc.list_flatten(counts.filter(pa.array(matching))).to_numpy(zero_copy_only=False)
            tokens[matching[rows]] = counted
        return cls(values, tokens, rows)

    def chunk_gaps(self) -> ChunkGaps:
        """Inter-chunk latency (ICL): one gap per pair of consecutive chunks of a request, its row, and the
        tokens the later chunk carried (computed once: runs hold tens of millions of chunks)."""
        if len(self.times) < 2:
            return ChunkGaps(np.empty(0, np.float32), np.empty(0, np.int64), np.empty(0, np.int64))
        same_request = self.rows[1:] == self.rows[:-1]
        return ChunkGaps(np.diff(self.times)[same_request], self.rows[1:][same_request], self.tokens[1:][same_request])

    def decode_span(self, n_rows: int) -> np.ndarray:
        """Per row: last chunk time - first chunk time (NaN for rows without streamed chunks)."""
        span = np.full(n_rows, np.nan)
        if len(self.times):
            ids = np.arange(n_rows)
            first = np.searchsorted(self.rows, ids, "left")
            last = np.searchsorted(self.rows, ids, "right") - 1
            has = last >= first
            span[has] = self.times[last[has]].astype(np.float64) - self.times[first[has]]
        return span


def _max_per_row(values: np.ndarray, rows: np.ndarray, n_rows: int) -> np.ndarray:
    """Largest value per row (NaN for rows without any); `rows` is sorted as Arrow list parents are."""
    out = np.full(n_rows, np.nan)
    if len(values):
        starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        out[rows[starts]] = np.maximum.reduceat(values, starts)
    return out


def slo_met(frame: pd.DataFrame, slo: SloConfig) -> np.ndarray:
    """Requests that succeeded and met every configured SLO (a failure is always a miss)."""
    met = frame["ok"].to_numpy().copy()
    for column, limit in (
        ("ttft_s", slo.ttft_s),
        ("tpot_s", slo.tpot_s),
        ("max_itl_s", slo.itl_s),
        ("e2e_s", slo.e2e_s),
    ):
        if limit is not None:
            values = frame[column].to_numpy()
            met &= ~(values > limit)  # NaN (e.g. no TPOT for a 1-token answer) does not count against it
    return met


def _request_frame(table: pa.Table, slo: SloConfig) -> tuple[pd.DataFrame, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Per-request frame with derived metrics; also the ITL and ICL gaps of successful requests with their rows."""
    frame = pd.DataFrame({name: _numpy_column(table, name) for name in REQUEST_COLUMNS})
    status = frame["status"].to_numpy()
    ok = frame["error"].isna().to_numpy() & np.isfinite(frame["e2e_s"].to_numpy()) & ~((status < 200) | (status >= 300))
    timing = TokenTiming.of(table)
    chunks = timing.chunk_gaps()
    token_gaps, chunk_gaps = chunks.per_token(), (chunks.gaps, chunks.rows)
    tokens = frame["output_tokens"].to_numpy()
    # TPOT = (last token time - first token time) / (tokens - 1), tokens as the server counted them.
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(tokens > 1, timing.decode_span(table.num_rows) / (tokens - 1), np.nan)
    frame["tpot_s"] = np.where(ok, tpot, np.nan)
    # The stall SLO is judged on the longest silence the user saw: between chunks, however many tokens follow.
    frame["max_itl_s"] = np.where(ok, _max_per_row(*chunk_gaps, table.num_rows), np.nan)
    frame["ok"] = ok
    frame["slo_met"] = slo_met(frame, slo)
    kept = {}
    for name, (gaps, rows) in (("itl", token_gaps), ("icl", chunk_gaps)):
        keep = ok[rows] if len(rows) else np.zeros(0, bool)
        kept[name] = (gaps[keep], rows[keep])
    return frame, kept


def _latency_statistics(name: str, values: np.ndarray, quantiles: np.ndarray | None = None) -> dict[str, float]:
    """`<name>_<statistic>` for every registry statistic; `quantiles` when they come from a histogram instead."""
    values = values[np.isfinite(values)]
    if quantiles is None:
        quantiles = np.quantile(values, list(QUANTILES.values())) if len(values) else [math.nan] * len(QUANTILES)
    mean = float(np.mean(values, dtype=np.float64)) if len(values) else math.nan
    return {f"{name}_mean": mean} | {f"{name}_{q}": float(v) for q, v in zip(QUANTILES, quantiles, strict=True)}


def _count_metrics(
    met: int,
    successes: int,
    n: int,
    output_tokens: float,
    duration: float,
    gpu_cost: float,
    energy_j: float | None,
    zero_as: float,
) -> dict[str, float]:
    """Metrics built from request counts; a zero count is replaced by `zero_as` (see `RunMetrics.comparable`)."""

    def count(value: int) -> float:
        return float(value) if value > 0 else zero_as

    def per_success(total: float | None) -> float:
        return total / count(successes) if total is not None and count(successes) else math.nan

    return {
        "slo_attainment": count(met) / max(n, 1),
        "goodput": count(met) / duration,
        "throughput": count(successes) / duration,
        "output_throughput": count(output_tokens) / duration,
        "failure_rate": count(n - successes) / max(n, 1),
        "cost_per_success": per_success(gpu_cost),
        "energy_per_success": per_success(energy_j),
    }


def _source_counts(table: pa.Table) -> dict[str, int]:
    counts = pc.value_counts(table.column("token_count_source").combine_chunks()).to_pylist()
    return {c["values"]: c["counts"] for c in counts if c["values"] is not None}


def _window_unix(meta: dict[str, str], first_s: float, last_s: float) -> tuple[float, float] | None:
    """The run's span (first due request to last end) on the wall clock; None for a file without its start time."""
    t0_unix = meta.get(META_T0_UNIX)
    if not t0_unix or not math.isfinite(first_s):
        return None
    return float(t0_unix) + first_s, float(t0_unix) + last_s


def load_run(
    path: Path,
    blocks: TimeBlocks,
    slo: SloConfig,
    decision: DecisionConfig,
    cost: CostConfig,
    telemetry: Path | None = None,
) -> RunMetrics:
    """Read one accepted result file and reduce it to `RunMetrics`; `telemetry`: the run's samples, for its energy."""
    table, meta = read_results(path)
    frame, gaps = _request_frame(table, slo)
    intended = frame["intended_s"].to_numpy()
    frame["block"] = blocks.of(intended)
    offered = float(meta[META_OFFERED_RATE]) if meta.get(META_OFFERED_RATE) else None
    fidelity = replay_fidelity(
        table,
        offered,
        decision.lag_budget_s,
        decision.rate_tolerance,
        worker_loads=loads_from_meta(meta),
        receive_lag_budget_s=decision.receive_lag_budget_s,
    )

    ends = frame["sent_s"].to_numpy() + frame["e2e_s"].to_numpy()
    last = np.nanmax(ends) if np.isfinite(ends).any() else np.nanmax(intended)
    duration = max(float(last - np.nanmin(intended)), 1e-9) if len(frame) else math.nan
    ok, met = frame["ok"].to_numpy(), frame["slo_met"].to_numpy()
    ttft = np.where(ok, frame["ttft_s"].to_numpy(), np.nan)
    e2e = np.where(ok, frame["e2e_s"].to_numpy(), np.nan)
    tpot, block = frame["tpot_s"].to_numpy(), frame["block"].to_numpy()
    n, successes = len(frame), int(ok.sum())
    gpu_hours = duration / 3600 * cost.gpus_per_arm
    by_metric = {"ttft": (ttft, block), "tpot": (tpot, block), "e2e": (e2e, block)}
    by_metric |= {name: (values, block[rows]) for name, (values, rows) in gaps.items()}
    histograms = np.stack([block_histograms(*by_metric[name], blocks.count) for name in LATENCY_METRICS])
    metrics = {}
    for name in LATENCY_METRICS:
        values = by_metric[name][0]
        if name in gaps:  # tens of millions of gaps: their quantiles come from the histogram (within 0.25 %)
            pooled = histograms[LATENCY_METRICS.index(name)].sum(axis=0)
            metrics |= _latency_statistics(name, values, quantiles_from_counts(pooled, tuple(QUANTILES.values())))
        else:
            metrics |= _latency_statistics(name, values)
    output_tokens = float(np.nansum(frame["output_tokens"].to_numpy()[ok]))
    first = float(np.nanmin(intended)) if len(frame) else math.nan
    energy = (
        run_energy(telemetry, _window_unix(meta, first, first + duration))
        if telemetry is not None
        else RunEnergy(None, "no telemetry read")
    )
    counts = (int(met.sum()), successes, n, output_tokens, duration, gpu_hours * cost.gpu_hour_price, energy.joules)
    failures = {str(k): int(v) for k, v in frame.loc[~ok, "error"].fillna("bad_status").value_counts().items()}
    return RunMetrics(
        arm=meta[META_ARM],
        repeat=int(meta[META_REPEAT]),
        path=path,
        simulated=meta.get(META_SIMULATED, "").lower() == "true",
        time_scale=float(meta[META_TIME_SCALE]) if meta.get(META_TIME_SCALE) else None,
        requests=frame,
        metrics=metrics | _count_metrics(*counts, zero_as=0.0),
        comparable=metrics | _count_metrics(*counts, zero_as=0.5),
        failures=failures,
        token_count_sources=_source_counts(table),
        fidelity=fidelity,
        duration_s=duration,
        histograms=histograms,
        energy=energy,
        request_id_prefix=meta.get(META_REQUEST_ID_PREFIX),
    )
