"""Render index.html: one self-contained page (inline CSS, figures as data URIs, no network) from jinja2."""

from __future__ import annotations

import datetime as dt
import json
import math

import jinja2
import numpy as np

from harness.analysis.analyse import RunAnalysis
from harness.analysis.decision import confidence_level, pct, pct_interval
from harness.analysis.inputs import ARMS
from harness.analysis.model import CHECK_FIELDS
from harness.records.decision_config import SloConfig
from harness.records.metric_registry import metric_of
from harness.report import figures
from harness.report.capacity_text import arm_capacity, capacity_gain
from harness.report.conditions_text import QUEUED_MEAN, engine_load_line, idle_gpu_spread
from harness.report.text_outputs import load_text

REPEAT_TABLE_METRICS = (
    "ttft_p50",
    "ttft_p99",
    "tpot_p50",
    "itl_p99",
    "e2e_p99",
    "slo_attainment",
    "throughput",
    "failure_rate",
)

# Row labels of the server cross-check, and who stamps each value in vLLM 0.24 (harness/analysis/server_metrics.py).
CHECK_LABELS = dict(
    zip(
        CHECK_FIELDS,
        (
            "mean TTFT (server: API server)",
            "mean TPOT (server: engine core)",
            "mean ITL (server: engine core, per step)",
            "mean E2E (server: API server)",
            "generated tokens",
            "prompt tokens",
            "requests (client: sent; server: finished)",
            "preemptions",
            "prefix-cache hit rate (cached / queried prompt tokens)",
        ),
        strict=True,
    )
)

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("harness.report", "templates"),
    autoescape=jinja2.select_autoescape(["html", "j2"]),
    undefined=jinja2.StrictUndefined,
)


def _num(value: float | None, digits: int = 3) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def _secs(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"


def _value(metric: str, value: float | None) -> str:
    """Format a metric value in its unit from the registry."""
    if value is None or not math.isfinite(value):
        return "—"
    unit = metric_of(metric).unit
    if unit == "fraction":
        return f"{value:.2%}"
    if unit in ("req/s", "tokens/s"):
        return f"{value:.2f} {unit}"
    if unit == "currency":
        return f"{value:.3g}"
    if unit == "J":
        return f"{value:.3g} J"
    return _secs(value)


def _check_value(name: str, value: float | None) -> str:
    """A cross-check value: seconds as latency, a rate as a percentage, anything else as a count."""
    if value is None or not math.isfinite(value):
        return "—"
    if name.endswith("_rate"):
        return f"{value:.1%}"
    return _secs(value) if name.endswith("_s") else f"{value:,.0f}"


def _geometric_mean(values: list[float | None]) -> float | None:
    usable = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    return float(np.exp(np.mean(np.log(usable)))) if usable and len(usable) == len(values) else None


def _flatten(data: object, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(data, dict):
        return [item for key, value in data.items() for item in _flatten(value, f"{prefix}{key}.")]
    text = data if isinstance(data, str) else "—" if data is None else json.dumps(data)
    return [(prefix.rstrip("."), text[:300])]


def _environment(env: dict[str, object]) -> tuple[list[tuple[str, str]], dict[str, list[tuple[str, str]]]]:
    """Short entries for the key-value list; long tables (e.g. every installed package) to fold away."""
    folded = {key: _flatten(value) for key, value in env.items() if isinstance(value, dict) and len(value) > 12}
    return _flatten({k: v for k, v in env.items() if k not in folded}), folded


def _slo_text(slo: SloConfig) -> str:
    parts = [
        f"{name} ≤ {_secs(limit)}"
        for name, limit in (("TTFT", slo.ttft_s), ("TPOT", slo.tpot_s), ("ITL", slo.itl_s), ("E2E", slo.e2e_s))
        if limit
    ]
    return ", ".join(parts) or "no latency SLO: success only"


def render_html(analysis: RunAnalysis, slo: SloConfig, lag_budget_s: float) -> str:
    s, plots = analysis.summary, analysis.plots
    failures: dict[str, dict[str, int]] = {}
    for run in s.runs:
        for cls, count in run.failures.items():
            failures.setdefault(cls, {}).setdefault(run.arm, 0)
            failures[cls][run.arm] += count
    fig = {
        "forest": figures.forest_plot(s.comparisons, confidence_level(s.alpha)),
        "ecdf": figures.latency_ecdfs(plots),
        "attainment": figures.attainment_over_time(plots, slo.attainment_target),
        "lag": figures.lag_histogram(plots, lag_budget_s),
        "rate": figures.rate_fidelity(s.runs),
        "capacity": figures.capacity_curves(s.capacity, slo.attainment_target),
    }
    speculating = any(r.spec_decode.acceptance_length is not None or r.spec_decode.configured for r in s.runs)
    if speculating:
        fig["acceptance"] = figures.throughput_vs_acceptance(s.runs)
    return _ENV.get_template("index.html.j2").render(
        s=s,
        fig=fig,
        arms=ARMS,
        failures=failures,
        repeat_metrics=REPEAT_TABLE_METRICS,
        definitions=list(dict.fromkeys(metric_of(c.metric) for c in s.comparisons)),
        check_labels=CHECK_LABELS,
        check_value=_check_value,
        speculating=speculating,
        tpot_tolerance=analysis.config.decision.server_tpot_tolerance,
        environment=_environment(s.environment),
        slo_text=_slo_text(slo),
        load_text=load_text(s.stability),
        arm_capacity=arm_capacity,
        capacity_gain=capacity_gain(s.capacity),
        idle_gpu=idle_gpu_spread(s.runs),
        engine_load=engine_load_line(s.runs),
        queued_mean=QUEUED_MEAN,
        ci_level=confidence_level(s.alpha),
        window_s=plots.window_s,
        generated=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        pct=lambda ratio: "—" if ratio is None else pct(ratio),
        num=_num,
        secs=_secs,
        value=_value,
        mean=_geometric_mean,
        ci=lambda low, high: "—" if low is None else pct_interval(low, high),
        money=lambda v: "—" if v is None else f"{v:.3g} {s.cost.currency}",
        pct0=lambda v: "—" if v is None else f"{v:.0%}",
        passfail=lambda v: "pass" if v else ("fail" if v is not None else "—"),
    )
