"""Is the baseline near or past its capacity? Detectors from data every result file already holds.

Near capacity a small speed difference integrates into a growing queue: a 1 % step change moves TPOT p50
~6 %, repeats disagree and the arms stop moving together, so a verdict there describes the load as much as
the candidate. Open-loop replay always *sends* at the offered rate, so the client's fidelity checks cannot
see this; the server side can: how many requests finish before the last arrival, whether the number in
flight (Little's law from send and end times) keeps growing, how much the baseline varies between repeats
against an A/A floor, and whether the arms still move together. Thresholds and the elasticities that turn
a load into an amplification are in `load_reference` with their sources.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from harness.analysis import load_reference as ref
from harness.analysis.model import CapacityEntry, Detector, LoadClass, RunStability, Stability
from harness.analysis.run_metrics import RunMetrics
from harness.records.result_schema import META_LOAD_SHARE

GRID_POINTS = 200  # in-flight count sampled this many times over the arrival window


def _load_share_of(run: RunMetrics) -> float | None:
    """The optional `replaybench.load_share` of a result file (written by runs that set the load from capacity)."""
    try:
        metadata = pq.read_schema(run.path).metadata or {}
        return float(metadata[META_LOAD_SHARE.encode()])
    except (KeyError, ValueError, OSError, pa.ArrowException):
        return None


def run_stability(run: RunMetrics) -> RunStability:
    """Completion share, in-flight level and growth of one run."""
    frame = run.requests
    intended = frame["intended_s"].to_numpy(float)
    starts = frame["sent_s"].to_numpy(float)
    ends = starts + frame["e2e_s"].to_numpy(float)
    first, last = (float(np.nanmin(intended)), float(np.nanmax(intended))) if len(frame) else (0.0, 0.0)
    span = last - first
    none = RunStability(
        arm=run.arm,
        repeat=run.repeat,
        arrival_span_s=None,
        arrival_rate=None,
        completed_before_last_arrival=None,
        inflight_mean_second_half=None,
        backlog_growth=None,
        load_share=_load_share_of(run),
    )
    if len(frame) < 10 or span <= 0:
        return none
    rate = len(frame) / span
    finished = np.isfinite(ends)  # a failed request with a time was in flight too
    completed = frame["ok"].to_numpy() & finished & (np.where(finished, ends, np.inf) <= last)
    grid = np.linspace(first, last, GRID_POINTS)
    inflight = np.searchsorted(np.sort(starts[finished]), grid, "right") - np.searchsorted(
        np.sort(ends[finished]), grid, "right"
    )
    second_half = grid > first + span / 2
    slope = float(np.polyfit(grid[second_half], inflight[second_half], 1)[0])
    return none.model_copy(
        update={
            "arrival_span_s": span,
            "arrival_rate": rate,
            "completed_before_last_arrival": float(completed.mean()),
            "inflight_mean_second_half": float(inflight[second_half].mean()),
            "backlog_growth": slope / rate,
        }
    )


def _median(values: list[float | None]) -> float | None:
    usable = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.median(usable)) if usable else None


def _log_tpot(runs: list[RunMetrics]) -> np.ndarray | None:
    values = np.array([r.metrics.get("tpot_p50", math.nan) for r in runs], float)
    return np.log(values) if len(values) and np.all(values > 0) else None


def _spread_and_correlation(pairs: list[tuple[RunMetrics, RunMetrics]]) -> tuple[float | None, float | None]:
    """Between-repeat sd of the baseline's log TPOT p50, and the arms' correlation of it across repeats."""
    base, cand = _log_tpot([b for b, _ in pairs]), _log_tpot([c for _, c in pairs])
    spread = float(np.std(base, ddof=1)) if base is not None and len(base) >= 3 else None
    correlation = None
    enough = base is not None and cand is not None and len(base) >= ref.CORRELATION_MIN_REPEATS
    if enough and np.std(base) > 0 and np.std(cand) > 0:
        correlation = float(np.corrcoef(base, cand)[0, 1])
    return spread, correlation


def _measured_load(
    baseline: list[RunStability], runs: list[RunMetrics], capacity: dict[str, CapacityEntry]
) -> tuple[float | None, str]:
    """The baseline's load share from the result files, else from capacity.json and the replayed time scale."""
    shares = [r.load_share for r in baseline]
    if shares and all(s is not None for s in shares):
        return float(np.mean(shares)), f"result metadata {META_LOAD_SHARE}"
    entry = capacity.get("baseline")
    scales = [r.time_scale for r in runs if r.time_scale]
    if entry is None or not entry.max_time_compression or not scales:
        return None, ""
    compression = 1 / float(np.median(scales))
    bound = "at most " if (entry.model_extra or {}).get("limit") == "at_least" else ""
    return compression / entry.max_time_compression, (
        f"capacity.json: {bound}{compression:.3g}x compression against the baseline's {entry.max_time_compression:.3g}x"
    )


def _specs(load_source: str) -> list[tuple[str, str, float, bool, str, str]]:
    """(measure, name, threshold, fires below?, what it says, where the threshold comes from) per detector."""
    elasticity = f"{ref.REVIEW}, §2 elasticity table"
    return [
        ("load", "load share of capacity", ref.NEAR_CAPACITY_LOAD, False, "near capacity",
         f"{load_source}; TPOT p50 elasticity passes 3 here ({elasticity})"),
        ("load", "load share of capacity", ref.PAST_CAPACITY_LOAD, False, "past capacity",
         f"{load_source}; SLO attainment falls below its target beyond capacity"),
        ("completion", "share of requests completed before the last arrival", ref.COMPLETION_SHARE_NEAR, True,
         "near capacity", f"{ref.REVIEW}, §2 detector table: 0.93 / 0.86 / 0.73 / 0.53 at 66 / 85 / 99 / 119 % "
         f"load (37-68 s of arrivals; not judged below {ref.COMPLETION_MIN_SPAN_S:g} s)"),
        ("growth", "in-flight growth over the 2nd half, share of the arrival rate", ref.BACKLOG_GROWTH_PAST, False,
         "past capacity", f"{ref.REVIEW}, §2 sweep: <= 0.04 up to 99 % load, 0.15 / 0.26 at 102 / 106 % "
         f"(not judged below {ref.COMPLETION_MIN_SPAN_S:g} s of arrivals)"),
        ("spread", "between-repeat sd of the baseline's log TPOT p50", ref.SPREAD_FACTOR * ref.AA_SPREAD_FLOOR, False,
         "noise amplified", f"{ref.SPREAD_FACTOR:g}x the A/A floor {ref.AA_SPREAD_FLOOR} (H200 A/A 0.09-0.11 at "
         f"~92 % load x0.35 for 65 %; {ref.REVIEW}, §2 and §4)"),
        ("correlation", "correlation of the arms' log TPOT p50 across repeats", ref.CORRELATION_FLOOR, True,
         "noise amplified", f"{ref.REVIEW}, §2: +0.84 in the H200 A/A, -0.48 in the rerun at 99-102 % load"),
    ]  # fmt: skip


def _detectors(measured: dict[str, float | None], load_source: str) -> list[Detector]:
    """Every detector with its value; the load share ones only when the load is known."""
    out = []
    for measure, name, threshold, below, means, source in _specs(load_source):
        value = measured[measure]
        if measure == "load" and value is None:
            continue
        fired = value is not None and (value < threshold if below else value >= threshold)
        out.append(
            Detector(
                name=name, value=value, threshold=threshold, fires_below=below, fired=fired, means=means, source=source
            )
        )
    return out


def _load_class(detectors: list[Detector], known: bool) -> LoadClass:
    fired = [d.means for d in detectors if d.fired]
    if "past capacity" in fired:
        return "past capacity"
    # Amplified spread with arms that no longer move together is the knee's signature even without a load.
    if "near capacity" in fired or fired.count("noise amplified") == 2:
        return "near capacity"
    return "below capacity" if known else "unknown"


def _banner(stability: Stability, candidate_past: bool) -> str | None:
    s = stability
    if s.load_class not in ("near capacity", "past capacity"):
        return None
    about = "≥" if s.load_at_least else "~"
    where = (
        f"the baseline ran at {about}{s.load_share:.0%} of its capacity ({s.load_source})"
        if s.load_share is not None
        else "the baseline's own results point at its capacity"
    )
    fired = "; ".join(
        f"{d.name} {d.value:.3g} {'<' if d.fires_below else '>='} {d.threshold:g}"
        for d in s.detectors
        if d.fired and d.value is not None
    )
    if s.tpot_p50_elasticity is not None:
        amplification = (
            f"There a 1% step-time change moves TPOT p50 ~{s.tpot_p50_elasticity:.1f}% and TTFT p50 "
            f"~{s.ttft_p50_elasticity:.1f}%"
        )
    else:
        amplification = "Near capacity a 1% step-time change moves TPOT p50 up to ~6%"
    more = " or more" if s.load_at_least else ""
    advice = (
        f"run at ~{s.suggested_load:.0%} of capacity: time scale x{s.suggested_time_scale_factor:.2f}{more}"
        + (f" (time_scale = {s.suggested_time_scale:.3g}{more})" if s.suggested_time_scale else "")
        if s.suggested_time_scale_factor
        else f"run at ~{s.suggested_load:.0%} of capacity (measure it with `replaybench capacity`)"
    )
    candidate = " The candidate's backlog grew too: it was past its capacity." if candidate_past else ""
    return (
        f"{where[0].upper()}{where[1:]}. {amplification} (review elasticity table), so effects are "
        f"amplified and repeats disagree; {advice}.{candidate} Fired: {fired}."
    )


def assess_stability(pairs: list[tuple[RunMetrics, RunMetrics]], capacity: dict[str, CapacityEntry]) -> Stability:
    """The `stability` section of summary.json, over the valid repeat pairs."""
    runs = [run_stability(run) for pair in pairs for run in pair]
    baseline = [r for r in runs if r.arm == "baseline"]
    # Completion share and backlog growth need arrivals long against a request's life: a short replay is all
    # ramp-up, whatever the load.
    judged = [r for r in runs if (r.arrival_span_s or 0) >= ref.COMPLETION_MIN_SPAN_S]
    long_enough = [r for r in judged if r.arm == "baseline"]
    completion = _median([r.completed_before_last_arrival for r in long_enough])
    growth = _median([r.backlog_growth for r in long_enough])
    spread, correlation = _spread_and_correlation(pairs)
    load, source = _measured_load(baseline, [b for b, _ in pairs], capacity)
    measured = {"load": load, "completion": completion, "growth": growth, "spread": spread, "correlation": correlation}
    detectors = _detectors(measured, source)
    load_class = _load_class(detectors, known=any(v is not None for v in (load, completion, growth)))
    at_least = False
    if load is None and completion is not None and load_class != "below capacity":
        load, at_least = ref.load_from_completion_share(completion)
        source = "estimated from the share of requests completed before the last arrival, by the review's table"
    scales = [b.time_scale for b, _ in pairs if b.time_scale]
    factor = load / ref.SUGGESTED_LOAD if load is not None else None
    candidate_growth = _median([r.backlog_growth for r in judged if r.arm == "candidate"])
    stability = Stability(
        load_class=load_class,
        load_share=load,
        load_at_least=at_least,
        load_source=source if load is not None else "",
        tpot_p50_elasticity=ref.tpot_p50_elasticity(load) if load is not None else None,
        ttft_p50_elasticity=ref.ttft_p50_elasticity(load) if load is not None else None,
        suggested_load=ref.SUGGESTED_LOAD,
        suggested_time_scale_factor=factor,
        suggested_time_scale=float(np.median(scales)) * factor if factor and scales else None,
        detectors=detectors,
        runs=runs,
        banner=None,
    )
    candidate_past = candidate_growth is not None and candidate_growth >= ref.BACKLOG_GROWTH_PAST
    return stability.model_copy(update={"banner": _banner(stability, candidate_past)})
