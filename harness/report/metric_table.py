"""The README's metric definitions, generated from the registry so the two cannot drift apart.

    python -m harness.report.metric_table            # rewrite the block in ./README.md
    python -m harness.report.metric_table --check    # exit 1 when the block is out of date

The block sits between `<!-- metric-definitions -->` and `<!-- /metric-definitions -->`; a test runs the
check against the repository's README.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.analysis.vllm_aliases import LATENCY_STATISTICS, TOTALS
from harness.errors import UserError
from harness.records.metric_registry import METRICS, STATISTICS, STATISTICS_TEXT, VLLM_ALIASES_TEXT, Metric

MARKER = "metric-definitions"
COMMAND = "python -m harness.report.metric_table"


def _cell(text: str | None) -> str:
    return "" if text is None else text.replace("|", "\\|")


def _name(metric: Metric) -> str:
    return f"`{metric.name}`"


def _alias_names() -> str:
    latency = ",".join(m.vllm_name for m in METRICS if m.latency and m.vllm_name)
    rates = [f"`{m.vllm_name}`" for m in METRICS if not m.latency and m.vllm_name]
    statistics = ",".join(LATENCY_STATISTICS)
    return ", ".join((f"`{{{statistics}}}_{{{latency}}}_ms`", *rates, *(f"`{name}`" for name in TOTALS)))


def definitions_markdown() -> str:
    """The definitions table plus the lines on statistics and vLLM-named aliases, as Markdown."""
    header = (
        "| metric | unit | formula | timestamps | failed requests | better | `vllm bench serve` | GuideLLM | AIPerf |",
        "|---|---|---|---|---|---|---|---|---|",
    )
    rows = tuple(
        "| "
        + " | ".join(
            (
                _name(m),
                m.unit,
                _cell(m.formula),
                _cell(m.timestamps),
                _cell(m.failures),
                m.better,
                _cell(m.peers.vllm),
                _cell(m.peers.guidellm),
                _cell(m.peers.aiperf),
            )
        )
        + " |"
        for m in METRICS
    )
    latency = ", ".join(f"`{m.name}`" for m in METRICS if m.latency)
    notes = (
        "",
        f"Latency metrics ({latency}) are named `<metric>_<statistic>` with statistic in "
        f"{', '.join(f'`{s}`' for s in STATISTICS)}, {STATISTICS_TEXT}. Times are seconds in result files and "
        "summary metrics, ms on screen. An empty peer cell: no difference known.",
        "",
        f"`summary.json` repeats them per arm under `vllm_aliases.<arm>` with the names `vllm bench serve "
        f"--save-result` writes ({_alias_names()}): {VLLM_ALIASES_TEXT}.",
    )
    return "\n".join((*header, *rows, *notes))


def replace_marked_block(text: str, marker: str, body: str, source: str) -> str:
    """`text` with the lines between `<!-- marker -->` and `<!-- /marker -->` replaced by `body`."""
    start, end = f"<!-- {marker} -->\n", f"<!-- /{marker} -->"
    head, found, rest = text.partition(start)
    _, closed, tail = rest.partition(end)
    if not found or not closed:
        raise UserError(f"{source}: no `{start.strip()}` ... `{end}` block; add both marker lines where it belongs")
    return f"{head}{start}{body}\n{end}{tail}"


def up_to_date_readme(readme: Path) -> tuple[str, str]:
    """(current text, text with freshly generated definitions) of `readme`."""
    try:
        current = readme.read_text(encoding="utf-8")
    except OSError as error:
        raise UserError(f"{readme}: cannot read it ({error.strerror}); run from the repository root") from None
    return current, replace_marked_block(current, MARKER, definitions_markdown(), str(readme))


def rewrite_or_check(readme: Path, check: bool) -> int:
    """Rewrite the block (exit status 0), or with `check` only say whether it is stale (1) or not (0)."""
    current, fresh = up_to_date_readme(readme)
    if current == fresh:
        return 0
    if check:
        print(f"{readme}: metric definitions are out of date; run `{COMMAND}`", file=sys.stderr)
        return 1
    readme.write_text(fresh, encoding="utf-8")
    print(f"{readme}: metric definitions rewritten")
    return 0


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("readme", nargs="?", type=Path, default=Path("README.md"), help="default ./README.md")
    parser.add_argument("--check", action="store_true", help="only report whether the block is up to date")
    args = parser.parse_args(argv)
    try:
        return rewrite_or_check(args.readme, args.check)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code


if __name__ == "__main__":
    sys.exit(_cli(sys.argv[1:]))
