"""Is the baseline near or past its capacity? Detectors from data every result file already holds.

Near capacity a small speed difference integrates into a growing queue: a 1 % step change moves TPOT p50
~6 %, repeats disagree and the arms stop moving together, so a verdict there describes the load as much as
the candidate. Open-loop replay always *sends* at the offered rate, so the client's fidelity checks cannot
see this; the server side can: how many requests finish before the last arrival, whether the number in
flight (Little's law from send and end times) keeps growing, how much the baseline varies between repeats
against an A/A floor, and whether the arms still move together. Thresholds and the elasticities that turn
a load into an amplification are in `load_reference` with their sources.

A drift (the servers slowing or speeding up over the experiment) is no load class but widens every interval
too; it is checked beside them, from the baseline's TPOT p50 against the repeat index (run order).
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from scipy import stats

from harness.analysis import load_reference as ref
from harness.analysis.model import CapacityEntry, Detector, Drift, LoadClass, RunStability, Stability, Trend
from harness.analysis.run_metrics import RunMetrics
from harness.records.result_schema import META_CAPACITY_SOURCE, META_LOAD_SHARE

GRID_POINTS = 200  # in-flight count sampled this many times over the arrival window


def _load_share_of(run: RunMetrics) -> tuple[float | None, str | None]:
    """The optional `replaybench.load_share` of a result file (written by runs that set the load from capacity) and
    where that capacity came from (`replaybench.capacity_source`, in files written since session 33)."""
    try:
        metadata = pq.read_schema(run.path).metadata or {}
        share = float(metadata[META_LOAD_SHARE.encode()])
    except (KeyError, ValueError, OSError, pa.ArrowException):
        return None, None
    source = metadata.get(META_CAPACITY_SOURCE.encode())
    return share, None if source is None else source.decode()


def run_stability(run: RunMetrics) -> RunStability:
    """Completion share, in-flight level and growth of one run."""
    frame = run.requests
    intended = frame["intended_s"].to_numpy(float)
    starts = frame["sent_s"].to_numpy(float)
    ends = starts + frame["e2e_s"].to_numpy(float)
    first, last = (float(np.nanmin(intended)), float(np.nanmax(intended))) if len(frame) else (0.0, 0.0)
    span = last - first
    share, source = _load_share_of(run)
    none = RunStability(
        arm=run.arm,
        repeat=run.repeat,
        arrival_span_s=None,
        arrival_rate=None,
        completed_before_last_arrival=None,
        inflight_mean_second_half=None,
        backlog_growth=None,
        load_share=share,
        capacity_source=source,
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


def _spread_and_correlation(base: np.ndarray | None, cand: np.ndarray | None) -> tuple[float | None, float | None]:
    """Between-repeat sd of the baseline's log TPOT p50, and the arms' correlation of it across repeats."""
    spread = float(np.std(base, ddof=1)) if base is not None and len(base) >= 3 else None
    correlation = None
    enough = base is not None and cand is not None and len(base) >= ref.CORRELATION_MIN_REPEATS
    if enough and np.std(base) > 0 and np.std(cand) > 0:
        correlation = float(np.corrcoef(base, cand)[0, 1])
    return spread, correlation


def _trend(repeats: np.ndarray, logs: np.ndarray) -> Trend:
    """First-to-last change of a log series as a ratio: Theil-Sen's, which one odd repeat cannot make, with the
    least-squares slope's 95 % interval, which can exclude zero at a handful of repeats where Theil-Sen's cannot."""
    span = repeats.max() - repeats.min()
    fit = stats.linregress(repeats, logs)
    half = stats.t.ppf(0.975, len(logs) - 2) * fit.stderr
    return Trend(
        ratio=math.exp(stats.theilslopes(logs, repeats).slope * span),
        ci_low=math.exp((fit.slope - half) * span),
        ci_high=math.exp((fit.slope + half) * span),
    )


def _drift(repeats: list[int], base: np.ndarray | None, cand: np.ndarray | None) -> Drift | None:
    """Trends of each arm's log TPOT p50 and of their difference against the repeat index, which is run order."""
    if base is None or len(base) < ref.DRIFT_MIN_REPEATS:
        return None
    x = np.array(repeats, float)
    return Drift(
        baseline=_trend(x, base),
        candidate=_trend(x, cand) if cand is not None else None,
        paired=_trend(x, cand - base) if cand is not None else None,
    )


def _measured_load(
    baseline: list[RunStability], runs: list[RunMetrics], capacity: dict[str, CapacityEntry]
) -> tuple[float | None, str]:
    """The baseline's load share from the result files, else from capacity.json and the replayed time scale."""
    shares = [r.load_share for r in baseline]
    if shares and all(s is not None for s in shares):
        sources = {r.capacity_source for r in baseline}
        named = f"; capacity from {sources.pop()}" if len(sources) == 1 and None not in sources else ""
        return float(np.mean(shares)), f"result metadata {META_LOAD_SHARE}{named}"
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
        ("drift", "change of the baseline's log TPOT p50 from the first repeat to the last (Theil-Sen, absolute)",
         ref.DRIFT_LOG_CHANGE, False, "drift", f"{ref.DRIFT_FACTOR:g}x the A/A floor {ref.AA_SPREAD_FLOOR}; fires "
         "only when the least-squares slope's 95 % interval excludes zero too (Theil-Sen's cannot at 5 repeats)"),
    ]  # fmt: skip


def _detectors(measured: dict[str, float | None], load_source: str, confirmed: dict[str, bool]) -> list[Detector]:
    """Every detector with its value; the load share ones only when the load is known. A detector whose measure
    `confirmed` names fires only where that also holds (the drift: where its interval excludes no change)."""
    out = []
    for measure, name, threshold, below, means, source in _specs(load_source):
        value = measured[measure]
        if measure == "load" and value is None:
            continue
        crossed = value is not None and (value < threshold if below else value >= threshold)
        fired = crossed and confirmed.get(measure, True)
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


def _scale_text(s: Stability, more: str) -> str:
    """The suggested time scale change, e.g. "time scale x1.44 (time_scale = 0.459)"."""
    scale = f" (time_scale = {s.suggested_time_scale:.3g}{more})" if s.suggested_time_scale else ""
    return f"time scale x{s.suggested_time_scale_factor:.2f}{more}{scale}"


def _capacity_advice(s: Stability) -> str:
    """Where the baseline ran, what that amplifies there, and how far to lower the load to get to the suggested one."""
    about = "≥" if s.load_at_least else "~"
    where = (
        f"the baseline ran at {about}{s.load_share:.0%} of its capacity ({s.load_source})"
        if s.load_share is not None
        else "the baseline's own results point at its capacity"
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
        f"run at ~{s.suggested_load:.0%} of capacity: {_scale_text(s, more)}"
        if s.suggested_time_scale_factor
        else f"run at ~{s.suggested_load:.0%} of capacity (measure it with `replaybench capacity`)"
    )
    return (
        f"{where[0].upper()}{where[1:]}. {amplification} (review elasticity table), so effects are "
        f"amplified and repeats disagree; {advice}."
    )


def _disagreement(s: Stability) -> str:
    """The declared load is light but the runs point at capacity: "run at the suggested load" would repeat the
    run, so say that the two disagree and how to settle it (a better capacity, or the runs' own estimate)."""
    if s.runs_load_share is not None:
        about = "≥" if s.runs_load_at_least else "~"
        runs = (
            f"by the review's table their share of requests completed before the last arrival puts the load at "
            f"{about}{s.runs_load_share:.0%}, where a 1% step-time change moves TPOT p50 "
            f"~{ref.tpot_p50_elasticity(s.runs_load_share):.1f}%"
        )
    else:
        runs = "their detectors point at capacity"
    more = " or more" if s.runs_load_at_least else ""
    lower = (
        f", or lower the load to ~{s.suggested_load:.0%} of capacity as the runs estimate it (only an estimate: "
        f"the table comes from 45-70 s replays): {_scale_text(s, more)}"
        if s.suggested_time_scale_factor
        else ""
    )
    return (
        f"The baseline was set to ~{s.load_share:.0%} of its capacity ({s.load_source}), but its own runs "
        f"disagree: {runs}. The capacity was likely over-estimated, or the servers slowed during the experiment. "
        "Re-measure it with more replays per probe and a tighter bracket (`replaybench capacity --repeats 3 "
        f"--tolerance 0.05`){lower}."
    )


def _ratio_interval(trend: Trend) -> str:
    return f"95% CI x{trend.ci_low:.2f}-x{trend.ci_high:.2f}"


def _drift_text(drift: Drift, restarted: bool | None) -> str:
    """How far each arm moved over the experiment, whether alike, and what to do about it (a restart per repeat
    only where the servers were not restarted already)."""
    base, cand, paired = drift.baseline, drift.candidate, drift.paired
    candidate = f", the candidate's x{cand.ratio:.2f}" if cand is not None else ""
    if paired is not None:
        candidate += (
            " (alike: their ratio shows no trend)"
            if paired.steady
            else f" (not alike: their ratio moved x{paired.ratio:.2f}, {_ratio_interval(paired)}, which pairing "
            "does not cancel)"
        )
    return (
        f"The servers drifted: the baseline's TPOT p50 {'rose' if base.ratio > 1 else 'fell'} x{base.ratio:.2f} "
        f"from the first repeat to the last (Theil-Sen; {_ratio_interval(base)} by least squares){candidate}. "
        "Pairing cancels a drift both arms share within a pair, but the drift widens every interval: "
        + (
            "the servers were already fresh for every repeat, so find its cause in what they ran on"
            if restarted
            else "restart the servers between repeats (`restart_per_repeat = true` in experiment.toml) or find its "
            "cause"
        )
        + " (server logs; the host's and GPUs' conditions per run in telemetry/ and the report's run table) before "
        "trusting a verdict."
    )


def _banner(s: Stability, candidate_past: bool, disagree: bool, restarted: bool | None) -> str | None:
    """The report's warning: capacity advice, the drift, then every detector that fired; None when neither."""
    parts = []
    if s.load_class in ("near capacity", "past capacity"):
        parts.append(_disagreement(s) if disagree else _capacity_advice(s))
        parts += ["The candidate's backlog grew too: it was past its capacity."] if candidate_past else []
    if s.drifted and s.drift is not None:
        parts.append(_drift_text(s.drift, restarted))
    if not parts:
        return None
    fired = "; ".join(
        f"{d.name} {d.value:.3g} {'<' if d.fires_below else '>='} {d.threshold:g}"
        for d in s.detectors
        if d.fired and d.value is not None
    )
    return " ".join(parts) + f" Fired: {fired}."


def assess_stability(
    pairs: list[tuple[RunMetrics, RunMetrics]], capacity: dict[str, CapacityEntry], restarted: bool | None = None
) -> Stability:
    """The `stability` section of summary.json, over the valid repeat pairs; `restarted`: whether every repeat had
    fresh servers (restart_per_repeat), which the drift's advice depends on."""
    runs = [run_stability(run) for pair in pairs for run in pair]
    baseline = [r for r in runs if r.arm == "baseline"]
    # Completion share and backlog growth need arrivals long against a request's life: a short replay is all
    # ramp-up, whatever the load.
    judged = [r for r in runs if (r.arrival_span_s or 0) >= ref.COMPLETION_MIN_SPAN_S]
    long_enough = [r for r in judged if r.arm == "baseline"]
    completion = _median([r.completed_before_last_arrival for r in long_enough])
    growth = _median([r.backlog_growth for r in long_enough])
    base, cand = _log_tpot([b for b, _ in pairs]), _log_tpot([c for _, c in pairs])
    spread, correlation = _spread_and_correlation(base, cand)
    drift = _drift([b.repeat for b, _ in pairs], base, cand)
    declared, source = _measured_load(baseline, [b for b, _ in pairs], capacity)
    measured = {
        "load": declared,
        "completion": completion,
        "growth": growth,
        "spread": spread,
        "correlation": correlation,
        "drift": abs(math.log(drift.baseline.ratio)) if drift is not None else None,
    }
    detectors = _detectors(measured, source, {"drift": drift is not None and not drift.baseline.steady})
    load_class = _load_class(detectors, known=any(v is not None for v in (declared, completion, growth)))
    runs_load, runs_at_least = ref.load_from_completion_share(completion) if completion is not None else (None, False)
    near = load_class in ("near capacity", "past capacity")
    # The runs fired while the declared load is too light for its own detectors to: the two disagree.
    disagree = near and declared is not None and declared < ref.NEAR_CAPACITY_LOAD
    load, at_least = declared, False
    if declared is None and near:
        load, at_least = runs_load, runs_at_least
        source = "estimated from the share of requests completed before the last arrival, by the review's table"
    aim = runs_load if disagree else load  # the load to lower from
    scales = [b.time_scale for b, _ in pairs if b.time_scale]
    factor = aim / ref.SUGGESTED_LOAD if aim is not None else None
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
        runs_load_share=runs_load,
        runs_load_at_least=runs_at_least,
        drift=drift,
    )
    candidate_past = candidate_growth is not None and candidate_growth >= ref.BACKLOG_GROWTH_PAST
    return stability.model_copy(update={"banner": _banner(stability, candidate_past, disagree, restarted)})
