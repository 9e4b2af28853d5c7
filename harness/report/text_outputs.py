"""The machine- and review-oriented outputs: decision.json, summary.json, summary.md (PR comment), junit.xml."""

from __future__ import annotations

import json
from xml.etree import ElementTree as ET

from harness.analysis.decision import confidence_level, describe_change, pct, pct_interval
from harness.analysis.load_reference import COMPLETION_MIN_SPAN_S
from harness.analysis.model import Estimator, Stability, Summary
from harness.report.capacity_text import capacity_line
from harness.report.conditions_text import conditions_line, engine_load_line

OUTCOME_ICONS = {"KEEP": "✅", "REJECT": "❌", "INCONCLUSIVE": "⚠️", "INVALID": "⛔"}


def decision_json(summary: Summary) -> str:
    payload = summary.decision.model_dump(mode="json") | {
        "exit_code": summary.decision.exit_code,
        "experiment": summary.experiment,
    }
    return json.dumps(payload, indent=1, ensure_ascii=False) + "\n"


def summary_json(summary: Summary) -> str:
    return summary.model_dump_json(indent=1) + "\n"


def load_text(stability: Stability) -> str:
    """E.g. "~99 % of the baseline's capacity (capacity.json: ...)", or why it is not known and what the runs said."""
    if stability.load_share is None:
        if stability.load_class == "unknown":  # no declared load, and every replay too short for the detectors
            said = (
                f"no [trace] load set, and no replay's arrivals spanned the {COMPLETION_MIN_SPAN_S:g} s the runs "
                "need to judge it"
            )
        else:
            said = f"the runs' detectors say {stability.load_class}"
        return (
            f"unknown share of capacity ({said}); set `[trace] load = 0.65` on a slice long enough to load the "
            "baseline, or run `replaybench capacity`"
        )
    about = "≥" if stability.load_at_least else "~"
    return f"{about}{stability.load_share:.0%} of the baseline's capacity ({stability.load_source})"


def estimator_lines(summary: Summary) -> list[str]:
    """Which metrics each estimator was used for, one line per estimator."""
    used: dict[Estimator, list[str]] = {}
    for c in summary.comparisons:
        used.setdefault(c.estimator, []).append(c.metric)
    return [f"{estimator.value}: {', '.join(metrics)}" for estimator, metrics in used.items()]


def summary_markdown(summary: Summary) -> str:
    """A short Markdown summary that fits a pull-request comment."""
    d = summary.decision
    lines = [
        f"### {OUTCOME_ICONS[d.outcome.value]} replaybench: **{d.outcome.value}** — {summary.experiment}",
        "",
        d.reason,
        "",
    ]
    if summary.stability.banner:
        lines += [f"> ⚠️ **{summary.stability.headline}.** {summary.stability.banner}", ""]
    if summary.simulated:
        lines += ["> Results come from the **simulated engine**, not real servers.", ""]
    if summary.mode == "A/A":
        lines += [
            "> **A/A run** (both arms serve identically): a KEEP or REJECT here is a false alarm, "
            f"expected at most {summary.alpha:.0%} of the time.",
            "",
        ]
    level = confidence_level(summary.alpha)
    lines += [f"| metric | role | change | {level} CI | margin | verdict |", "|---|---|---|---|---|---|"]
    for c in summary.comparisons:
        verdict = c.verdict or (f"q={c.q_value:.3f}" if c.q_value is not None else "—")
        margin = f"±{c.margin:.0%}" if c.margin is not None else "—"
        interval = pct_interval(c.ci_low, c.ci_high)
        lines.append(f"| {c.metric} | {c.role} | {pct(c.ratio)} | {interval} | {margin} | {verdict} |")
    excluded = "; ".join(f"r{e.repeat}: {', '.join(e.reasons)}" for e in d.excluded)
    lines += [
        "",
        f"Repeats used: {len(d.repeats_used)}" + (f" · excluded: {excluded}" if excluded else ""),
        f"Load: {load_text(summary.stability)}",
        "Estimators: " + "; ".join(estimator_lines(summary)),
        summary.planning.line,
        f"Cost: {summary.cost.line}",
        f"Energy per successful request: {summary.cost.energy_line}",
        *filter(None, [capacity_line(summary.capacity)]),
        *_server_check_lines(summary),
        *_acceptance_lines(summary),
        *_prefix_cache_lines(summary),
        *_segment_lines(summary),
        *filter(None, [conditions_line(summary.runs), engine_load_line(summary.runs)]),
    ]
    if summary.quality.measured:
        q = summary.quality
        lines.append(
            f"Quality: pass rate {q.baseline_pass_rate or 0:.0%} → {q.candidate_pass_rate or 0:.0%}, "
            f"identical outputs {q.identical_fraction or 0:.0%}"
        )
    lines += ["", f"<sub>Rule: {d.rule}</sub>", ""]
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1e3:.2f}"


def _server_check_lines(summary: Summary) -> list[str]:
    """Mean TPOT client / server per arm, and each run whose cross-check warned (nothing without server data)."""
    means = summary.server_check
    if not any(m.server["tpot_mean_s"] is not None for m in means.values()):
        return []
    pairs = " · ".join(
        f"{arm} {_ms(m.client['tpot_mean_s'])} / {_ms(m.server['tpot_mean_s'])} ms" for arm, m in means.items()
    )
    warned = [f"⚠️ {r.arm} r{r.repeat}: {w}" for r in summary.runs for w in r.warnings]
    return [f"Server cross-check, mean TPOT client / server: {pairs}", *warned]


def _acceptance_lines(summary: Summary) -> list[str]:
    """The speculative-decoding parity line, with the AL each arm's command configures (none: no speculation)."""
    check = summary.acceptance
    if check is None or not check.line:
        return []
    configured = " · ".join(
        f"{arm} {'—' if value is None else f'{value:g}'}" for arm, value in check.configured.items()
    )
    return [f"Speculative decoding: {check.line}; configured AL {configured}"]


def _segment_lines(summary: Summary) -> list[str]:
    """The request segments that fare differently from the whole run (BH q below alpha), or that none does."""
    if not summary.segments:
        return []
    found = [g for g in summary.segments if g.q_vs_whole < summary.alpha]
    head = f"By request segment (exploratory, {len(summary.segments)} segment comparisons, BH)"
    if not found:
        return [f"{head}: no segment fares differently from the whole run (q ≥ {summary.alpha:g})"]
    shown = "; ".join(
        f"{g.metric} {pct(g.ratio)} ({pct_interval(g.ci_low, g.ci_high)}) for {g.segment}, "
        f"{pct(g.vs_whole)} against the whole run (q={g.q_vs_whole:.3f})"
        for g in found
    )
    return [f"{head}: {shown}"]


def _prefix_cache_lines(summary: Summary) -> list[str]:
    """The arms' prefix-cache hit rates, flagged when they differ beyond the tolerance (nothing when uncounted)."""
    check = summary.prefix_cache
    if check is None or not check.line:
        return []
    return [f"{'⚠️ ' if check.matched is False else ''}Prefix cache (server): {check.line}"]


def junit_xml(summary: Summary) -> str:
    """One test case per decision metric (target + gate); a regression or undefined metric is a failure."""
    deciding = [c for c in summary.comparisons if c.role != "exploratory"]
    suite = ET.Element("testsuite", name=f"replaybench.{summary.experiment}", tests=str(len(deciding)))
    failures = 0
    for c in deciding:
        case = ET.SubElement(suite, "testcase", classname=f"replaybench.{c.role}", name=c.metric)
        text = f"{describe_change(c)}, margin ±{c.margin:.0%}, verdict {c.verdict}"
        if c.regression_flag or c.ratio is None:
            failures += 1
            ET.SubElement(case, "failure", message=text).text = c.note or summary.decision.reason
        elif (c.role == "target" and c.verdict != "IMPROVEMENT") or not c.non_inferior:
            ET.SubElement(case, "skipped", message=f"not shown: {text}")
        else:
            ET.SubElement(case, "system-out").text = text
    suite.set("failures", str(failures))
    suites = ET.Element("testsuites")
    suites.append(suite)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
