"""Matplotlib figures for the report, returned as base64 PNG data URIs so the HTML needs no other file."""

from __future__ import annotations

import base64
import io

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np

from harness.analysis.analyse import PlotData
from harness.analysis.log_histogram import EDGES_S
from harness.analysis.model import CapacityEntry, MetricComparison, RunRow
from harness.records.metric_registry import BY_NAME, LATENCY_METRICS

ARM_COLOURS = {"baseline": "#5b6b7f", "candidate": "#d9822b"}
VERDICT_COLOURS = {
    "IMPROVEMENT": "#1a7f37",
    "REGRESSION": "#cf222e",
    "EQUIVALENT": "#0969da",
    "INCONCLUSIVE": "#9a6700",
    None: "#6e7781",
}
PERCENT_TICKS = (-90, -75, -50, -30, -20, -10, -5, -2, 0, 2, 5, 10, 20, 30, 50, 100, 200, 400)

plt.rcParams.update(
    {
        "font.size": 9,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.25,
        "figure.dpi": 110,
        "savefig.bbox": "tight",
    }
)


def _data_uri(figure: plt.Figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _spaced_ratio_ticks(low: float, high: float) -> list[float]:
    """Percent-change ticks inside (low, high), at least ~8 % of the log axis apart, always including 0 %."""
    min_gap = 0.08 * np.log(high / low)
    kept = [1.0]
    for side in (sorted(t for t in PERCENT_TICKS if t > 0), sorted((t for t in PERCENT_TICKS if t < 0), reverse=True)):
        last = 1.0
        for tick in (1 + t / 100 for t in side):
            if low <= tick <= high and abs(np.log(tick / last)) >= min_gap:
                kept.append(tick)
                last = tick
    return sorted(kept)


def _log_ticks(low: float, high: float) -> list[float]:
    """1-2-5 ticks inside a log axis; for a narrow range, three evenly spaced (in log) rounded values instead."""
    decades = range(int(np.floor(np.log10(low))), int(np.ceil(np.log10(high))) + 1)
    ticks = [m * 10.0**d for d in decades for m in (1, 2, 5) if low <= m * 10.0**d <= high]
    if len(ticks) >= 3:
        return ticks[:: max(1, len(ticks) // 5)]
    return [float(f"{t:.2g}") for t in np.geomspace(low, high, 5)[1:-1]]


def _duration_label(seconds: float, _: object = None) -> str:
    if seconds >= 1:
        return f"{seconds:g} s"
    return f"{seconds * 1e3:g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:g} µs"


def forest_plot(comparisons: list[MetricComparison], ci_level: str) -> str:
    """Ratio (candidate / baseline) with its CI per metric, coloured by verdict, the ±δ band shaded grey."""
    shown = [c for c in comparisons if c.ratio is not None]
    figure, axis = plt.subplots(figsize=(7.2, 0.38 * max(len(shown), 2) + 0.9))
    if not shown:
        axis.set_axis_off()
        axis.text(
            0.5,
            0.5,
            "no metric could be compared: see the verdict",
            ha="center",
            va="center",
            color="#59636e",
            transform=axis.transAxes,
        )
        return _data_uri(figure)
    for row, c in enumerate(reversed(shown)):
        colour = VERDICT_COLOURS.get(c.verdict, VERDICT_COLOURS[None])
        axis.plot([c.ci_low, c.ci_high], [row, row], color=colour, lw=2.4, solid_capstyle="round")
        axis.plot([c.ratio], [row], "o", color=colour, ms=6)
        if c.margin:
            axis.add_patch(
                plt.Rectangle(
                    (1 / (1 + c.margin), row - 0.4),
                    (1 + c.margin) - 1 / (1 + c.margin),
                    0.8,
                    color="#8c959f",
                    alpha=0.13,
                    lw=0,
                )
            )
    labels = [
        f"{c.metric}{'  (target)' if c.role == 'target' else '  (explor.)' if c.role == 'exploratory' else ''}"
        for c in reversed(shown)
    ]
    axis.set_yticks(range(len(shown)), labels)
    axis.axvline(1.0, color="#24292f", lw=0.8)
    axis.set_xscale("log")
    axis.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(_spaced_ratio_ticks(*axis.get_xlim())))
    axis.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{(x - 1) * 100:+.0f}%"))
    axis.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    axis.set_xlabel(f"candidate vs baseline ({ci_level} t-interval over repeats; grey: ±δ)")
    axis.grid(axis="y", visible=False)
    return _data_uri(figure)


def latency_ecdfs(plots: PlotData) -> str:
    """ECDF per arm for every latency kind, on a log time axis (from the pooled per-block histograms)."""
    figure, axes = plt.subplots(1, len(LATENCY_METRICS), figsize=(11, 2.7))
    for index, (axis, kind) in enumerate(zip(axes, LATENCY_METRICS, strict=True)):
        low, high = np.inf, 0.0
        for arm, counts in plots.histograms.items():
            series = counts[index] if counts.shape[0] > index else np.zeros(1)
            total = series.sum()
            if total == 0:
                continue
            cdf = np.cumsum(series) / total
            used = np.flatnonzero(series)
            low, high = min(low, EDGES_S[used[0]]), max(high, EDGES_S[used[-1] + 1])
            axis.step(EDGES_S[1:], cdf, where="post", color=ARM_COLOURS.get(arm), label=arm, lw=1.4)
        axis.set_xscale("log")
        if high > 0:
            axis.set_xlim(low, high)
        axis.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(_log_ticks(*axis.get_xlim())))
        axis.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_duration_label))
        axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axis.set_title(BY_NAME[kind].title, fontsize=9)
        axis.set_ylim(0, 1.01)
    axes[0].set_ylabel("fraction of requests")
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(loc="lower right", frameon=False)
    figure.tight_layout()
    return _data_uri(figure)


def attainment_over_time(plots: PlotData, target: float) -> str:
    figure, axis = plt.subplots(figsize=(7.2, 2.6))
    for arm, values in plots.attainment.items():
        axis.plot(
            np.append(plots.window_starts_s, plots.window_starts_s[-1] + plots.window_s),
            np.append(values, values[-1]) * 100,
            drawstyle="steps-post",
            color=ARM_COLOURS.get(arm),
            label=arm,
            lw=1.4,
        )
    axis.axhline(target * 100, color="#cf222e", lw=0.8, ls="--", label=f"target {target:.0%}")
    lowest = min([float(np.nanmin(v)) * 100 for v in plots.attainment.values() if np.isfinite(v).any()] + [100.0])
    axis.set_ylim(max(0.0, min(lowest, target * 100) - 2), 100.5)
    axis.set_xlabel("trace time (s)")
    axis.set_ylabel("SLO attainment (%)")
    axis.legend(frameon=False, ncols=3, loc="lower left")
    figure.tight_layout()
    return _data_uri(figure)


def lag_histogram(plots: PlotData, budget_s: float) -> str:
    figure, axis = plt.subplots(figsize=(5.2, 2.6))
    finite = [lags[np.isfinite(lags)] * 1e3 for lags in plots.lags_s.values()]
    top = max([float(np.quantile(v, 0.999)) for v in finite if len(v)] + [budget_s * 1e3 * 1.2])
    bins = np.linspace(min([float(v.min()) for v in finite if len(v)] + [0.0]), top, 60)
    for (arm, _), values in zip(plots.lags_s.items(), finite, strict=True):
        axis.hist(np.clip(values, None, top), bins=bins, color=ARM_COLOURS.get(arm), alpha=0.55, label=arm)
    axis.axvline(budget_s * 1e3, color="#cf222e", lw=0.8, ls="--", label="p99 budget")
    axis.set_yscale("log")
    axis.set_xlabel("send lag (ms, actual - intended)")
    axis.set_ylabel("requests")
    axis.legend(frameon=False)
    figure.tight_layout()
    return _data_uri(figure)


def rate_fidelity(runs: list[RunRow]) -> str:
    """Achieved vs offered request rate per run; the identity line is perfect replay."""
    figure, axis = plt.subplots(figsize=(3.6, 2.6))
    for run in runs:
        if run.offered_rate and run.achieved_rate:
            axis.plot(
                run.offered_rate,
                run.achieved_rate,
                "o" if run.valid else "x",
                ms=5,
                color=ARM_COLOURS.get(run.arm, "#6e7781"),
            )
    rates = [r for run in runs for r in (run.offered_rate, run.achieved_rate) if r]
    if rates:
        low, high = min(rates) * 0.98, max(rates) * 1.02
        axis.plot([low, high], [low, high], color="#24292f", lw=0.7)
        axis.set_xlim(low, high)
        axis.set_ylim(low, high)
    axis.set_xlabel("offered (req/s)")
    axis.set_ylabel("achieved (req/s)")
    figure.tight_layout()
    return _data_uri(figure)


REALISTIC_AL = (2.4, 3.5)  # MTP at k = 3 on real text (../shared/research/gdn_specdecode.md §B.5)


def throughput_vs_acceptance(runs: list[RunRow]) -> str:
    """Server-emitted tokens/s against the measured acceptance length, one point per run (no speculation: AL 1)."""
    figure, axis = plt.subplots(figsize=(5.2, 2.8))
    axis.axvspan(*REALISTIC_AL, color="#8c959f", alpha=0.13, lw=0, label="realistic MTP AL (k=3)")
    for arm in ARM_COLOURS:
        for valid in (True, False):
            mine = [r.spec_decode for r in runs if r.arm == arm and r.valid == valid]
            points = [(s.acceptance_length or 1.0, s.emitted_throughput) for s in mine if s.emitted_throughput]
            if points:
                axis.plot(
                    *zip(*points, strict=True),
                    "o" if valid else "x",
                    ms=5,
                    color=ARM_COLOURS[arm],
                    label=arm if valid else f"{arm} (invalid)",
                )
    axis.set_xlabel("acceptance length, measured (tokens per verify step)")
    axis.set_ylabel("emitted tokens/s (server)")
    axis.legend(frameon=False, fontsize=8)
    figure.tight_layout()
    return _data_uri(figure)


def _probe_points(entry: CapacityEntry) -> tuple[list[tuple[float, float, bool]], list[tuple[float, float]]]:
    """(compression, attainment, valid) of every probe run, and (compression, mean attainment) of every probe."""
    runs, means = [], []
    for probe in (entry.model_extra or {}).get("probes") or []:
        seen = [
            (float(run["attainment"]), bool(run["valid"]))
            for run in probe.get("runs", [])
            if run.get("attainment") is not None
        ]
        runs += [(float(probe["compression"]), value, valid) for value, valid in seen]
        if seen:
            means.append((float(probe["compression"]), float(np.mean([value for value, _ in seen]))))
    return runs, sorted(means)


def capacity_curves(capacity: dict[str, CapacityEntry], target: float) -> str | None:
    """Each arm's SLO attainment against the load it was offered (trace compression), from `replaybench capacity`'s
    probes: every run a point, the probes' means joined, the target and each arm's capacity marked. None without
    probes (a capacity.json from before they were kept, or none)."""
    points = {arm: _probe_points(entry) for arm, entry in capacity.items() if arm in ARM_COLOURS}
    if not any(runs for runs, _ in points.values()):
        return None
    figure, axis = plt.subplots(figsize=(5.2, 2.8))
    axis.axhline(target, color="#6e7781", ls="--", lw=1, label=f"target {target:.0%}")
    for arm, (runs, means) in points.items():
        colour = ARM_COLOURS[arm]
        for valid in (True, False):
            mine = [(x, y) for x, y, ok in runs if ok == valid]
            if mine:
                axis.plot(*zip(*mine, strict=True), "o" if valid else "x", ms=4, color=colour, alpha=0.7,
                          label=None if valid else f"{arm} (invalid replay)")  # fmt: skip
        if means:
            axis.plot(*zip(*means, strict=True), "-", color=colour, lw=1.2, label=arm)
        best = capacity[arm].max_time_compression
        if best is not None:
            axis.axvline(best, color=colour, ls=":", lw=1)
    axis.set_xscale("log")
    axis.set_xlabel("offered load (trace compression, x; dotted: each arm's capacity)")
    axis.set_ylabel("SLO attainment")
    axis.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    axis.legend(frameon=False, fontsize=8)
    figure.tight_layout()
    return _data_uri(figure)
