"""The machine- and review-oriented outputs: decision.json, summary.json, summary.md (PR comment), junit.xml."""

from __future__ import annotations

import json
from xml.etree import ElementTree as ET

from harness.analysis.decision import describe_change, pct, pct_interval
from harness.analysis.load_share import describe_load_share
from harness.analysis.model import Summary

OUTCOME_ICONS = {"KEEP": "✅", "REJECT": "❌", "INCONCLUSIVE": "⚠️", "INVALID": "⛔"}


def decision_json(summary: Summary) -> str:
    payload = summary.decision.model_dump(mode="json") | {
        "exit_code": summary.decision.exit_code,
        "experiment": summary.experiment,
    }
    return json.dumps(payload, indent=1, ensure_ascii=False) + "\n"


def summary_json(summary: Summary) -> str:
    return summary.model_dump_json(indent=1) + "\n"


def summary_markdown(summary: Summary) -> str:
    """A short Markdown summary that fits a pull-request comment."""
    d = summary.decision
    lines = [
        f"### {OUTCOME_ICONS[d.outcome.value]} replaybench: **{d.outcome.value}** — {summary.experiment}",
        "",
        d.reason,
        "",
        describe_load_share(summary.load_share),
        "",
    ]
    if summary.simulated:
        lines += ["> Results come from the **simulated engine**, not real servers.", ""]
    if summary.mode == "A/A":
        lines += [
            "> **A/A run** (both arms serve identically): a KEEP or REJECT here is a false alarm, "
            f"expected at most {summary.alpha:.0%} of the time.",
            "",
        ]
    lines += ["| metric | role | change | 95% CI | margin | verdict |", "|---|---|---|---|---|---|"]
    for c in summary.comparisons:
        verdict = c.verdict or (f"q={c.q_value:.3f}" if c.q_value is not None else "—")
        margin = f"±{c.margin:.0%}" if c.margin is not None else "—"
        interval = pct_interval(c.ci_low, c.ci_high)
        lines.append(f"| {c.metric} | {c.role} | {pct(c.ratio)} | {interval} | {margin} | {verdict} |")
    excluded = "; ".join(f"r{e.repeat}: {', '.join(e.reasons)}" for e in d.excluded)
    lines += [
        "",
        f"Repeats used: {len(d.repeats_used)}" + (f" · excluded: {excluded}" if excluded else ""),
        f"Cost: {summary.cost.line}",
    ]
    if summary.quality.measured:
        q = summary.quality
        lines.append(
            f"Quality: pass rate {q.baseline_pass_rate or 0:.0%} → {q.candidate_pass_rate or 0:.0%}, "
            f"identical outputs {q.identical_fraction or 0:.0%}"
        )
    lines += ["", f"<sub>Rule: {d.rule}</sub>", ""]
    return "\n".join(lines)


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
