"""Each variant's churn rows against the baseline's, repeat by repeat (churn_step.py's results file), or pooled
over passes that ran the arms in mirrored orders.

    python3 -m replayssm_patch.gpu.churn_summary replayssm_patch/gpu/results/churn_step-h200-qwen3.5-4b.json
    python3 -m replayssm_patch.gpu.churn_summary PASS1.json PASS2.json     # arms A B C, then C B A

Why repeat by repeat: an engine under churn slows from one repeat to the next (H200, 2026-12-03: +23 % from the
first to the second, in both arms), so each arm's k-th repeat, both from a fresh engine, is the fair pair; the
medians of the rows would mix the drift into the ratio. Why pooled: a host's speed also drifts over a session
(2026-12-03: the baseline's decode-only step 5.4 ms in its first repeats, 7.1 ms in its last, the GPU's work the
same), so arms run one after the other differ by when they ran. With the arms of the second pass in the reverse
order of the first, each arm's repeats sit symmetrically around the session's middle, and a linear drift cancels
in the mean over all of them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from replayssm_patch.gpu.churn_step import WHAT
from replayssm_patch.gpu.markdown_table import table_head, table_row
from replayssm_patch.gpu.row_file import RowFileError, read_row_file

SETTING = ("mode", "batch", "prompt_tokens", "output_tokens")
RATIOS = (("mean_ms", "mean step"), ("mixed_ms", "mixed step"), ("decode_ms", "decode-only step"),
          ("tokens_per_s", "output tok/s"))  # fmt: skip


def _ratio(over: dict[str, Any] | None, under: dict[str, Any] | None, field: str) -> str:
    if over is None or under is None or not over.get(field) or not under.get(field):
        return "—"
    return f"{over[field] / under[field]:.3f}"


def _clock(repeat: dict[str, Any] | None) -> str:
    share = ((repeat or {}).get("conditions") or {}).get("gpu_clock_share")
    return "—" if share is None else f"{share:.2f}"


def paired_table(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table: per setting, variant and repeat index, the variant's figures over the baseline's."""
    baselines = {tuple(r[k] for k in SETTING): r for r in rows if r["variant"] == "baseline"}
    head = ["mode", "batch", "prompt / output", "variant", "repeat", *(label for _, label in RATIOS),
            "GPU clock share (variant / baseline)"]  # fmt: skip
    lines = table_head(head)
    for row in rows:
        base = baselines.get(tuple(row[k] for k in SETTING))
        if row["variant"] == "baseline" or base is None:
            continue
        for k, (mine, theirs) in enumerate(zip(row["repeats"], base["repeats"], strict=False)):
            cells = [row["mode"], row["batch"], f"{row['prompt_tokens']} / {row['output_tokens']}", row["variant"],
                     k + 1, *(_ratio(mine, theirs, field) for field, _ in RATIOS),
                     f"{_clock(mine)} / {_clock(theirs)}"]  # fmt: skip
            lines.append(table_row(cells))
    return "\n".join(lines) + "\n"


def pooled_table(passes: Sequence[Sequence[dict[str, Any]]]) -> str:
    """A markdown table: per setting and variant, the mean of every repeat in every pass, and that mean over the
    baseline's (a variant's repeats and the baseline's need not pair up: the order of the passes does the work)."""
    pooled: dict[tuple, list[dict[str, Any]]] = {}
    for rows in passes:
        for row in rows:
            pooled.setdefault((*(row[k] for k in SETTING), row["variant"]), []).extend(row["repeats"])
    head = ["mode", "batch", "prompt / output", "variant", "repeats",
            *(f"{label} (÷ baseline)" for _, label in RATIOS)]  # fmt: skip
    lines = table_head(head)
    for (*setting, variant), repeats in pooled.items():
        base = pooled.get((*setting, "baseline"))
        if base is None:
            continue
        mine, theirs = _means(repeats), _means(base)
        cells = [setting[0], setting[1], f"{setting[2]} / {setting[3]}", variant, len(repeats),
                 *(f"{mine[field]:.2f} ({_ratio(mine, theirs, field)})" for field, _ in RATIOS)]  # fmt: skip
        lines.append(table_row(cells))
    return "\n".join(lines) + "\n"


def _means(repeats: Sequence[dict[str, Any]]) -> dict[str, float]:
    return {field: sum(r[field] for r in repeats) / len(repeats) for field, _ in RATIOS}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("error: give one churn_step results file (or several passes to pool), e.g. "
              "replayssm_patch/gpu/results/churn_step-h200.json")  # fmt: skip
        return 2
    passes = []
    for name in args:
        path = Path(name)
        if not path.is_file():
            print(f"error: {path} does not exist; give the file churn_step wrote with --out")
            return 2
        try:
            passes.append(read_row_file(path, WHAT)["rows"])
        except RowFileError as exc:
            print(f"error: {exc}")
            return 2
        if not any(r.get("variant") == "baseline" for r in passes[-1]):
            print(f"error: {name} holds no baseline row to pair with; run churn_step --variant baseline into it")
            return 2
    print(paired_table(passes[0]) if len(passes) == 1 else pooled_table(passes), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
