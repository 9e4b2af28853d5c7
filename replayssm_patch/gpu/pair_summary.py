"""The table of engine_pair.py's results file: each candidate's paired ratio over the baseline with its interval,
each engine's load and clock, and issue 15's or 16's targets.

    python3 -m replayssm_patch.gpu.pair_summary replayssm_patch/gpu/results/engine_pair-h200.json

Why: a paired row's figure is an interval, not a point: the verdict says whether the target is met by the ratio and
whether the whole 95 % interval clears it (the same reading the harness's decision gives a paired A/B).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from replayssm_patch.gpu.engine_pair import BASELINE, WHAT
from replayssm_patch.gpu.engine_summary import Targets, clock_text, left_out_text, table_order, target, targets_of
from replayssm_patch.gpu.markdown_table import table_head, table_row
from replayssm_patch.gpu.row_file import RowFileError, read_row_file
from replayssm_patch.gpu.spec_summary import NONE, times_text


def _load(row: dict[str, Any], arm: str) -> str:
    seqs = (row.get("max_concurrency") or {}).get(arm)
    return NONE if not seqs else f"{row['batch'] / seqs:.0%}"


def pair_verdict(wanted: float | None, row: dict[str, Any]) -> str:
    """Met by the ratio, and whether its interval clears the target too (or holds it: not shown either way)."""
    if wanted is None:
        return ""
    if row.get("ratio") is None:
        return f"≥ {wanted:.2f}×: not measured"
    if row["ci_low"] >= wanted:
        return f"≥ {wanted:.2f}×: met, the whole interval above"
    if row["ratio"] >= wanted:
        return f"≥ {wanted:.2f}×: met by the ratio, the interval reaches below"
    return f"≥ {wanted:.2f}×: NOT met" + (", the interval reaches above" if row["ci_high"] >= wanted else "")


def pair_line(row: dict[str, Any], targets: Targets | None) -> str:
    """One table line of a paired row."""
    ci = NONE if row.get("ci_low") is None else f"{row['ci_low']:.2f}-{row['ci_high']:.2f}×"
    windows = f"{row['candidate_window_ms'] or NONE} / {row['baseline_window_ms'] or NONE}"
    cells = [row["mode"], str(row["batch"]), row["variant"], str(len(row.get("pairs", []))), windows,
             times_text(row.get("ratio")), ci, f"{_load(row, row['variant'])} / {_load(row, BASELINE)}",
             clock_text(row)]  # fmt: skip
    if targets is not None:
        cells.append(pair_verdict(target(targets, row["variant"], row["mode"], row["batch"]), row))
    return table_row(cells)


def pair_markdown(rows: Sequence[dict[str, Any]], targets: Targets | None) -> str:
    """The table of every valid paired row, then the rows left out and why."""
    head = ["mode", "batch", "variant", "pairs", "window ms: variant / baseline", "speed-up", "95% CI",
            "load: variant / baseline", "SM MHz", *([f"issue {targets.issue} target"] if targets else [])]  # fmt: skip
    lines = ["# Engine-side decode step, paired (replayssm_patch/gpu/engine_pair.py)", "",
             "Speed-up = the geometric mean over pairs of the baseline's decode window ÷ the variant's, each pair's "
             "two windows seconds apart on the same prompts; 95% CI: a t interval over the pairs. Load = the batch "
             "as a share of each engine's maximum concurrency.", "",
             *table_head(head)]  # fmt: skip
    ordered = sorted(rows, key=table_order)
    lines += [pair_line(row, targets) for row in ordered if row.get("valid", True)]
    left_out = [f"- {left_out_text(r)}" for r in ordered if not r.get("valid", True)]
    return "\n".join([*lines, *(["", "Left out:", "", *left_out] if left_out else [])]) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("error: give one engine_pair results file, e.g. replayssm_patch/gpu/results/engine_pair-h200.json")
        return 2
    path = Path(args[0])
    if not path.is_file():
        print(f"error: {path} does not exist; give the file engine_pair wrote with --out")
        return 2
    try:
        rows = read_row_file(path, WHAT)["rows"]
    except RowFileError as exc:
        print(f"error: {exc}")
        return 2
    print(pair_markdown(rows, targets_of(path)), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
