"""The engine-step table of engine_step.py's results file: each ReplaySSM variant's decode step over the
baseline's, with the evidence a ratio needs printed beside it, and issue 15's or 16's targets.

    python3 -m replayssm_patch.gpu.engine_summary replayssm_patch/gpu/results/engine_step-h100.json [--pool]

Why: until session 33 these ratios were worked out by hand from the rows, and the load and the clocks that make a
ratio believable were read from other files, if at all. Per mode and batch, each variant's line gives: the decode
window (the mean period between the engine core's steps while the whole batch decodes; the step from t272 − t16
for rows measured before the window existed) with the spread of its repeats; its speed-up over the baseline by the
window and by the step; the speed-up of its slowest repeat over the baseline's fastest (a gain every repeat shows);
the batch as a share of each arm's maximum concurrency; the SM clock means (a candidate that ran at a higher clock
than the baseline owes part of its gain to the clock); and, where the file's issue sets one (15 for Nemotron-H-8B,
16 for qwen3.5-4b, by the file's name), the target and whether it is met. A ratio of two rows from different GPUs
or days is marked †. Where the file has a host floor beside it (``<stem>-floor.json``), the table is followed
by the floor at each batch and the variants whose step lies within the floor's repeats. With ``--pool``, a row
run more than once on one GPU on one day (a job run again) is the pooled row of all its runs' repeats from the
file's history (pooled_rows.py), and says how many runs it holds.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replayssm_patch.gpu.engine_step import WHAT
from replayssm_patch.gpu.markdown_table import table_head, table_row
from replayssm_patch.gpu.pooled_rows import pool_rows, read_history
from replayssm_patch.gpu.row_file import RowFileError, read_row_file
from replayssm_patch.gpu.spec_summary import NONE, OTHER_HOSTS, OTHER_HOSTS_NOTE, other_hosts, times_text


@dataclass(frozen=True)
class Targets:
    """What an issue asks of a model's engine rows in vLLM's default compile mode: no slower than the baseline
    (``NO_SLOWER``) at every batch up to ``small_batches``, and a speed-up per variant at batch 256."""

    issue: int
    small_batches: int
    at_256: dict[str, float]


NO_SLOWER = 0.98
ISSUE_15 = Targets(15, 64, {"replayssm_fp32": 1.3, "replayssm_split": 1.5})  # Mamba-2: Nemotron-H-8B
ISSUE_16 = Targets(16, 32, {"replayssm_fp32": 1.25, "replayssm_split": 1.25})  # Gated DeltaNet: qwen3.5-4b


def targets_of(path: Path) -> Targets | None:
    """The issue whose targets a results file's rows answer, from its name (``engine_step-<card>[-<model>].json``):
    Nemotron-H-8B's file (no model suffix) answers issue 15, qwen3.5-4b's issue 16; the host floors and other
    models answer none."""
    suffix = path.stem.split("-", 2)[2] if path.stem.count("-") >= 2 else ""
    return {"": ISSUE_15, "qwen3.5-4b": ISSUE_16}.get(suffix)


def target(targets: Targets | None, variant: str, mode: str, batch: int) -> float | None:
    """The speed-up the issue asks of this row, or None where it asks none (-O0 rows, batch 128, a floor)."""
    if targets is None or mode != "default":
        return None
    if batch <= targets.small_batches:
        return NO_SLOWER
    return targets.at_256.get(variant) if batch == 256 else None


def window_ms(row: dict[str, Any]) -> float | None:
    """The row's decode window, or its step where it has none (rows before the window existed)."""
    return row.get("window_step_ms") or row.get("step_ms")


def repeat_windows(row: dict[str, Any]) -> list[float]:
    """Each repeat's window mean (its step where the repeat has no window)."""
    return [(r.get("window") or {}).get("mean_ms") or r["step_ms"] for r in row.get("repeats", [])]


def _ratio(base: float | None, mine: float | None) -> float | None:
    return base / mine if base and mine else None


def _load(row: dict[str, Any]) -> str:
    seqs = row.get("max_concurrency")
    return NONE if not seqs else f"{row['batch'] / seqs:.0%}"


def clock_text(row: dict[str, Any]) -> str:
    """The SM clock's mean while the row ran, in MHz (– where not sampled)."""
    mhz = (row.get("conditions") or {}).get("gpu_sm_mhz_mean")
    return NONE if mhz is None else f"{mhz:,.0f}"


def table_order(row: dict[str, Any]) -> tuple[Any, ...]:
    """Where a row stands in a table: default mode first, then by mode, batch and variant."""
    return (row["mode"] != "default", row["mode"], row["batch"], row["variant"])


def left_out_text(row: dict[str, Any]) -> str:
    """Why an invalid row is not in the table, as its problems say."""
    return f"{row['variant']} {row['mode']}, batch {row['batch']}: {'; '.join(row.get('problems') or ['invalid'])}"


def verdict_text(wanted: float | None, got: float | None) -> str:
    if wanted is None:
        return ""
    if got is None:
        return f"≥ {wanted:.2f}×: not measured"
    return f"≥ {wanted:.2f}×: {'met' if got >= wanted else 'NOT met'}"


def variant_line(row: dict[str, Any], base: dict[str, Any], targets: Targets | None) -> tuple[str, bool]:
    """One table line of `row` against the baseline row `base` of its mode and batch, and whether they ran apart."""
    apart = other_hosts(row, base)
    mark = OTHER_HOSTS if apart else ""
    by_window = _ratio(window_ms(base), window_ms(row))
    worst = _ratio(min(repeat_windows(base), default=None), max(repeat_windows(row), default=None))
    spread = row.get("window_spread_ms") if row.get("window_step_ms") else row.get("spread_ms")
    runs = f"; {row['runs']} runs" if row.get("runs", 1) > 1 else ""
    cells = [row["mode"], str(row["batch"]), row["variant"],
             f"{window_ms(row):.2f} ({NONE if spread is None else f'{spread:.2f}'}{runs})",
             times_text(by_window) + mark, times_text(_ratio(base.get("step_ms"), row.get("step_ms"))) + mark,
             times_text(worst) + mark, f"{_load(row)} / {_load(base)}",
             f"{clock_text(row)} / {clock_text(base)}"]  # fmt: skip
    if targets is not None:
        cells.append(verdict_text(target(targets, row["variant"], row["mode"], row["batch"]), by_window))
    return table_row(cells), apart


def floor_lines(rows: Sequence[dict[str, Any]], floor: Sequence[dict[str, Any]]) -> list[str]:
    """Per mode and batch with a host-floor row (host_floor.py: the same layers at toy widths, next to no GPU work):
    its window and the range of its repeats beside the baseline's window, and the variants whose window lies within
    that range, whose step there is near vLLM's own host work rather than their kernels' (a floor from another GPU
    or day is marked †)."""
    lines = []
    for low in sorted((r for r in floor if r["variant"] == "baseline" and r.get("valid", True)), key=table_order):
        here = [r for r in rows if (r["mode"], r["batch"]) == (low["mode"], low["batch"])]
        base = next((r for r in here if r["variant"] == "baseline"), None)
        repeats = repeat_windows(low)
        if base is None or not repeats:
            continue
        within = [f"{r['variant']} {window_ms(r):.2f} ms" for r in here
                  if r["variant"] != "baseline" and window_ms(r) <= max(repeats)]  # fmt: skip
        verdict = (f"within its range: {', '.join(within)} (there the step is near vLLM's own host work)" if within
                   else "every variant above its range")  # fmt: skip
        mark = OTHER_HOSTS if other_hosts(low, base) else ""
        spread = f"{min(repeats):.2f}-{max(repeats):.2f}"
        lines.append(f"- {low['mode']}, batch {low['batch']}: host floor {window_ms(low):.2f} ms{mark} (repeats "
                     f"{spread}), the baseline {window_ms(base):.2f} ms; {verdict}")  # fmt: skip
    head = (
        "Host floor (the same layers at toy widths, host_floor.py; † measured on another GPU or day than the baseline):"
    )
    return ["", head, "", *lines] if lines else []


def summary_markdown(
    rows: Sequence[dict[str, Any]], targets: Targets | None, floor: Sequence[dict[str, Any]] = ()
) -> str:
    """The table of every valid variant row that has a valid baseline row of its mode and batch, then the rows left
    out and why, then the host floor beside them where `floor` (the floor file's rows) has one; the last column
    holds `targets` (None: no target column)."""
    valid = [r for r in rows if r.get("valid", True)]
    baselines = {(r["mode"], r["batch"]): r for r in valid if r["variant"] == "baseline"}
    head = ["mode", "batch", "variant", "window ms (spread)", "speed-up, window", "speed-up, step",
            "slowest repeat / baseline's fastest", "load: variant / baseline", "SM MHz: variant / baseline",
            *([f"issue {targets.issue} target"] if targets else [])]  # fmt: skip
    lines = ["# Engine-side decode step over the baseline (replayssm_patch/gpu/engine_step.py)", "",
             "Speed-up = the baseline's time per step ÷ the variant's. Load = the batch as a share of the arm's "
             "maximum concurrency (vLLM's requests of max_model_len tokens the engine holds).", "",
             *table_head(head)]  # fmt: skip
    mixed = False
    left_out = [left_out_text(r) for r in rows if not r.get("valid", True)]
    for row in sorted(valid, key=table_order):
        if row["variant"] == "baseline":
            continue
        base = baselines.get((row["mode"], row["batch"]))
        if base is None:
            left_out.append(f"{row['variant']} {row['mode']}, batch {row['batch']}: no valid baseline row to pair")
            continue
        line, apart = variant_line(row, base, targets)
        lines.append(line)
        mixed |= apart
    lines += floor_lines(valid, floor)
    if mixed:
        lines += ["", OTHER_HOSTS_NOTE]
    if left_out:
        lines += ["", "Left out:", "", *(f"- {reason}" for reason in left_out)]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    pool = "--pool" in args
    args = [arg for arg in args if arg != "--pool"]
    if len(args) != 1:
        print("error: give one engine_step results file (and --pool to pool runs from its history), e.g. "
              "replayssm_patch/gpu/results/engine_step-h200.json")  # fmt: skip
        return 2
    path = Path(args[0])
    if not path.is_file():
        print(f"error: {path} does not exist; give the file engine_step wrote with --out")
        return 2
    floor_path = path.with_name(f"{path.stem}-floor.json")
    try:
        rows = read_row_file(path, WHAT)["rows"]
        floor = read_row_file(floor_path, WHAT)["rows"]  # none: no floor measured for this file
        if pool:
            rows = pool_rows(rows, read_history(path))
            floor = pool_rows(floor, read_history(floor_path))
    except RowFileError as exc:
        print(f"error: {exc}")
        return 2
    if not any(r["variant"] == "baseline" for r in rows):
        print(f"error: {path} holds no baseline row to pair with; run engine_step --variant baseline into it")
        return 2
    print(summary_markdown(rows, targets_of(path), floor), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
