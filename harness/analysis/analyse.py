"""Analyse a run directory end to end: results -> valid repeat pairs -> comparisons -> decision (+ plot data).

This is the public entry point of the analysis layer (`analyse_run_dir`); it never needs the servers.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from harness.analysis.cache_parity import prefix_cache_check
from harness.analysis.compare import compare_metrics
from harness.analysis.cost import summarise_cost
from harness.analysis.decision import decide
from harness.analysis.inputs import ARMS, RunInputs, final_attempt, read_inputs
from harness.analysis.look_levels import at_look, looks_rule_text
from harness.analysis.model import (
    ExcludedRepeat,
    Outcome,
    RunConditions,
    RunRow,
    ServerCheck,
    SpecDecodeRun,
    Summary,
)
from harness.analysis.planning import plan_next_run
from harness.analysis.quality import summarise_quality
from harness.analysis.review import review_tables
from harness.analysis.run_conditions import run_conditions
from harness.analysis.run_metrics import RunMetrics, TimeBlocks, load_run
from harness.analysis.segments import segment_comparisons
from harness.analysis.server_check import arm_means, server_check
from harness.analysis.server_metrics import read_snapshots
from harness.analysis.spec_config import configured_speculation
from harness.analysis.spec_decode import acceptance_check, spec_decode_run
from harness.analysis.stability import assess_stability
from harness.analysis.tail_samples import thin_tail_notes
from harness.analysis.vllm_aliases import vllm_aliases
from harness.errors import UserError
from harness.records.decision_config import AnalysisConfig, DecisionConfig
from harness.records.metric_registry import LATENCY_METRICS
from harness.records.result_schema import CHUNKS, FINAL_USAGE, TEXT_CHUNKS

MAX_BLOCKS = 64  # more blocks add memory, not information: a block should be long against queue memory
BLOCK_S = 10.0  # shortest trace-time window of the per-block histograms and the review's windows


@dataclass
class PlotData:
    """Arrays the report draws; kept out of summary.json."""

    histograms: dict[str, np.ndarray]  # arm -> (latency kind, BINS) counts summed over valid repeats
    attainment: dict[str, np.ndarray]  # arm -> SLO attainment per plotting window, mean over repeats
    window_starts_s: np.ndarray
    window_s: float
    lags_s: dict[str, np.ndarray]  # arm -> send lags of the valid runs


@dataclass
class RunAnalysis:
    summary: Summary
    plots: PlotData
    config: AnalysisConfig  # as declared in experiment.toml, or the defaults when it is missing


def time_blocks(paths: list[Path], block_s: float) -> TimeBlocks:
    """One block grid for every run, from the trace span (block length grows so there are ≤ MAX_BLOCKS)."""
    lows, highs = [], []
    for path in paths:
        try:
            column = pq.read_table(path, columns=["intended_s"]).column(0).to_numpy()
        except (OSError, ValueError, KeyError):
            continue  # load_run reports the unreadable file
        if len(column):
            lows.append(column.min())
            highs.append(column.max())
    start, end = (min(lows), max(highs)) if lows else (0.0, 0.0)
    length = max(block_s, (end - start) / MAX_BLOCKS * 1.0001, 1e-9)
    return TimeBlocks(start_s=float(start), block_s=float(length), count=max(1, math.ceil((end - start) / length)))


RunKey = tuple[str, int]  # (arm, repeat)
Pair = tuple[RunMetrics, RunMetrics]  # (baseline, candidate) of one repeat


def _load_runs(inputs: RunInputs, blocks: TimeBlocks) -> tuple[dict[RunKey, RunMetrics], dict[RunKey, str]]:
    """Load every result file; an unreadable one becomes a problem of its (arm, repeat), not a crash."""
    config = inputs.config
    runs, problems = {}, {}
    for key, path in inputs.results.items():
        try:
            runs[key] = load_run(path, blocks, config.slo, config.decision, config.cost, inputs.run.telemetry(*key))
        except UserError as error:
            problems[key] = str(error)
    return runs, problems


def _pairs(
    inputs: RunInputs, runs: dict[RunKey, RunMetrics], problems: dict[RunKey, str]
) -> tuple[list[int], list[ExcludedRepeat]]:
    """Repeats where both arms have a valid accepted run; every other repeat is named with its reasons."""
    repeats = sorted({repeat for _, repeat in inputs.results} | {a.repeat for a in inputs.attempts})
    used, excluded = [], []
    for repeat in repeats:
        reasons = []
        for arm in ARMS:
            run = runs.get((arm, repeat))
            final = final_attempt(inputs.attempts, arm, repeat)
            if (arm, repeat) in problems:
                reasons.append(f"{arm}: unreadable result ({problems[(arm, repeat)]})")
            elif final is not None and final.status != "accepted":
                # The runner keeps a crashed/invalid last try as the repeat's result file, and says so here.
                reasons.append(f"{arm}: {final.status}" + (f" ({final.reason})" if final.reason else ""))
            elif run is None:
                reasons.append(f"{arm}: no result file")
            elif not run.fidelity.valid:
                reasons.append(f"{arm}: invalid replay ({'; '.join(run.fidelity.reasons)})")
        if reasons:
            excluded.append(ExcludedRepeat(repeat=repeat, reasons=reasons))
        else:
            used.append(repeat)
    return used, excluded


def _run_row(
    run: RunMetrics, check: ServerCheck, spec_decode: SpecDecodeRun, conditions: RunConditions | None
) -> RunRow:
    f = run.fidelity
    busiest = f.busiest_worker
    shares = [w.cpu_share for w in f.worker_loads or () if w.cpu_share is not None]

    def ms(value: float | None) -> float | None:
        return None if value is None else value * 1e3

    return RunRow(
        arm=run.arm,
        repeat=run.repeat,
        file=run.path.name,
        valid=f.valid,
        reasons=list(f.reasons),
        warnings=[check.warning] if check.warning else [],
        requests=len(run.requests),
        successes=int(run.requests["ok"].sum()),
        metrics=run.metrics,
        failures=run.failures,
        lag_p50_ms=ms(f.lag_p50_s),
        lag_p99_ms=ms(f.lag_p99_s),
        lag_max_ms=ms(f.lag_max_s),
        offered_rate=f.offered_rate,
        achieved_rate=f.achieved_rate,
        output_mismatches=f.output_mismatches,
        duration_s=run.duration_s,
        time_scale=run.time_scale,
        simulated=run.simulated,
        token_count_sources=run.token_count_sources,
        server_check=check,
        spec_decode=spec_decode,
        receive_lag_p50_ms=ms(busiest.receive_lag_p50_s) if busiest else None,
        receive_lag_p99_ms=ms(busiest.receive_lag_p99_s) if busiest else None,
        receive_lag_max_ms=ms(busiest.receive_lag_max_s) if busiest else None,
        client_cpu_share=max(shares) if shares else None,
        conditions=conditions,
        request_id_prefix=run.request_id_prefix,
    )


def _looks_note(decision: DecisionConfig, ran: int, outcome: Outcome) -> list[str]:
    """With sequential looks: how many repeats ran, and whether the run stopped at this look (between looks the
    decision itself is INVALID and says why)."""
    if not decision.looks or ran not in decision.looks:
        return []
    head = f"sequential {looks_rule_text(decision)}, this one at {decision.alpha:.3g}"
    if ran == decision.looks[-1]:
        return [f"{head}: {ran} repeat(s) ran, the last look"]
    if outcome in (Outcome.KEEP, Outcome.REJECT):
        return [
            f"{head}: {ran} repeat(s) ran, stopped early: this look decided (its interval keeps its level, but a run "
            "stopped early by a large change tends to overstate it: read the size of the change from the interval)"
        ]
    return [f"{head}: {ran} repeat(s) ran and this look did not decide: resume the run to the next look"]


def _unmeasured_receive_lag(runs: dict[RunKey, RunMetrics]) -> list[str]:
    """A note naming how many result files carry no receive lag (and so were not gated on it)."""
    unmeasured = sum(run.fidelity.worker_loads is None for run in runs.values())
    if not unmeasured:
        return []
    return [
        f"receive lag not measured in {unmeasured} of {len(runs)} result file(s) (written before replay measured "
        "it, or by the virtual-time simulator): those runs are not gated on it"
    ]


def _attainment_windows(runs: list[RunMetrics], blocks: TimeBlocks) -> tuple[np.ndarray, float]:
    """Plotting windows over the trace span: ~25 requests each on average, between 5 and 60 windows."""
    requests = max((len(r.requests) for r in runs), default=0)
    count = int(np.clip(requests // 25, 5, 60))
    width = max(blocks.block_s * blocks.count / count, 1e-9)
    return blocks.start_s + width * np.arange(count), width


def _attainment(run: RunMetrics, starts: np.ndarray, width: float) -> np.ndarray:
    index = np.clip(((run.requests["intended_s"].to_numpy() - starts[0]) // width).astype(np.int64), 0, len(starts) - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.bincount(index, run.requests["slo_met"].to_numpy(float), len(starts)) / np.bincount(
            index, minlength=len(starts)
        )


def _plot_data(pairs: list[tuple[RunMetrics, RunMetrics]], blocks: TimeBlocks) -> PlotData:
    starts, width = _attainment_windows([run for pair in pairs for run in pair], blocks)
    histograms, attainment, lags = {}, {}, {}
    for index, arm in enumerate(ARMS):
        runs = [pair[index] for pair in pairs]
        empty = np.zeros((len(LATENCY_METRICS), 1), np.int64)
        histograms[arm] = sum(r.histograms.sum(axis=1, dtype=np.int64) for r in runs) if runs else empty
        per_run = [_attainment(r, starts, width) for r in runs]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an empty window is NaN in every run
            attainment[arm] = np.nanmean(per_run, axis=0) if per_run else np.full(len(starts), np.nan)
        lags[arm] = np.concatenate([r.requests["lag_s"].to_numpy() for r in runs]) if runs else np.empty(0)
    return PlotData(histograms=histograms, attainment=attainment, window_starts_s=starts, window_s=width, lags_s=lags)


TOKEN_COUNT_NOTES = {
    TEXT_CHUNKS: "TPOT/ITL of {n} run(s) are chunk-counted (superseded): written before tokens were counted by "
    "the server, every chunk with text counted as one token; re-run for token-counted figures",
    CHUNKS: "{n} run(s) got no usage from the server: TPOT/ITL count each streamed chunk as one token",
    FINAL_USAGE: "{n} run(s) got usage only at the end of each stream: TPOT uses the server's token count, "
    "but ITL counts each chunk as one token (enable continuous usage stats for per-token ITL)",
}


def token_count_notes(runs: list[RunMetrics]) -> list[str]:
    """Say where TPOT/ITL rest on less than per-chunk server token counts (DESIGN: a number is its clock)."""
    notes = []
    for source, text in TOKEN_COUNT_NOTES.items():
        n = sum(1 for run in runs if run.token_count_sources.get(source))
        if n:
            notes.append(text.format(n=n))
    return notes


def _alias_runs(arm: str, pairs: list[Pair], runs: dict[RunKey, RunMetrics]) -> list[RunMetrics]:
    """The arm's runs of the valid repeat pairs; every readable run of the arm when no pair is valid."""
    used = [pair[ARMS.index(arm)] for pair in pairs]
    return used or [run for (name, _), run in sorted(runs.items()) if name == arm]


def _row(run: RunMetrics, inputs: RunInputs) -> RunRow:
    """One run's row: its replay, and its server's /metrics (cross-check, speculative decoding)."""
    snapshots = read_snapshots(
        inputs.run.metrics(run.arm, run.repeat, "before"), inputs.run.metrics(run.arm, run.repeat, "after")
    )
    configured = configured_speculation(inputs.commands.get(run.arm))
    return _run_row(
        run,
        server_check(run, snapshots, inputs.config.decision.server_tpot_tolerance),
        spec_decode_run(snapshots, run.duration_s, configured),
        run_conditions(inputs.run.telemetry(run.arm, run.repeat)),
    )


def _pair_rows(arm: str, rows: list[RunRow], used: list[int]) -> list[RunRow]:
    """The arm's rows of the valid repeat pairs; every row of the arm when no pair is valid."""
    mine = [r for r in rows if r.arm == arm]
    return [r for r in mine if r.repeat in used] or mine


def analyse_run_dir(root: Path) -> RunAnalysis:
    """Re-analyse a run directory from its files. Raises `UnusableRunDir` only when there are no results."""
    inputs = read_inputs(root)
    repeats_run = len({a.repeat for a in inputs.attempts} | {repeat for _, repeat in inputs.results})
    # every test at the level the pre-registered looks leave this look (alpha without looks)
    config = inputs.config.model_copy(update={"decision": at_look(inputs.config.decision, repeats_run)})
    blocks = time_blocks(list(inputs.results.values()), BLOCK_S)
    runs, problems = _load_runs(inputs, blocks)
    used, excluded = _pairs(inputs, runs, problems)
    pairs = [(runs[("baseline", k)], runs[("candidate", k)]) for k in used]
    comparisons = compare_metrics(pairs, config.decision)
    planning = plan_next_run(comparisons, config.decision, len(pairs))
    quality = summarise_quality(inputs.run.quality_json, config.quality)
    config_note = next((n for n in inputs.notes if "experiment.toml" in n), "")
    rows = [_row(runs[key], inputs) for key in sorted(runs, key=lambda k: (k[1], k[0]))]
    acceptance = acceptance_check(
        {arm: [r.spec_decode for r in _pair_rows(arm, rows, used)] for arm in ARMS},
        config.decision.acceptance_tolerance,
    )
    decision = decide(
        comparisons=comparisons,
        decision=config.decision,
        quality_limits=config.quality,
        quality=quality,
        declared=inputs.declared,
        repeats_used=used,
        excluded=excluded,
        planning=planning,
        config_note=config_note,
        acceptance=acceptance,
        repeats_run=repeats_run,
    )
    cost = summarise_cost(
        [b.metrics["cost_per_success"] for b, _ in pairs],
        [c.metrics["cost_per_success"] for _, c in pairs],
        config.cost,
        (
            [b.metrics["energy_per_success"] for b, _ in pairs],
            [c.metrics["energy_per_success"] for _, c in pairs],
            [run.energy for pair in pairs for run in pair],
        ),
    )
    review_requests, review_windows = review_tables(pairs, blocks)
    server_means = arm_means(rows, ARMS)
    summary = Summary(
        run_dir=str(inputs.run.root),
        experiment=inputs.experiment,
        mode=inputs.mode,
        decision=decision,
        comparisons=comparisons,
        planning=planning,
        stability=assess_stability(pairs, inputs.capacity, inputs.restarted),
        runs=rows,
        server_check=server_means,
        prefix_cache=prefix_cache_check(server_means, config.decision.prefix_cache_tolerance),
        segments=segment_comparisons(pairs, config.decision.alpha),
        acceptance=acceptance,
        quality=quality,
        cost=cost,
        capacity=inputs.capacity,
        review_requests=review_requests,
        review_windows=review_windows,
        environment=inputs.environment,
        failed_attempts=[a for a in inputs.attempts if a.status != "accepted"],
        simulated=any(r.simulated for r in runs.values()),
        notes=inputs.notes
        + token_count_notes(list(runs.values()))
        + ([quality.note] if quality.note else [])
        + _unmeasured_receive_lag(runs)
        + thin_tail_notes([run for pair in pairs for run in pair], config.decision)
        + _looks_note(config.decision, repeats_run, decision.outcome),
        alpha=config.decision.alpha,
        vllm_aliases={arm: vllm_aliases(_alias_runs(arm, pairs, runs)) for arm in ARMS},
    )
    return RunAnalysis(summary=summary, plots=_plot_data(pairs, blocks), config=config)
