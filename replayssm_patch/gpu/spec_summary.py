"""The markdown summary of spec_step.py's rows: issue 17's "done when" table, one per speculative setting.

Per compile mode, k and configured acceptance length, and per batch: each arm's output tokens/s (with its time per
engine step and, speculating, the AL it measured), ReplaySSM spec over native spec and over native standard
decode, and the maximum concurrency of native spec against ReplaySSM spec. The standard arms do not depend on
k or AL, so their rows of the same mode and batch appear in every setting's table. A ratio is given only where
both rows are valid (an AL off its configuration, a preemption or a batch run in waves gives "–"), and marked †
where the two rows ran on different hosts; the concurrency is an engine fact and is shown whatever the speed rows
say. Invalid rows and why follow the tables, then where each row that kept its conditions ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replayssm_patch.gpu.engine_step import FIT_STEP
from replayssm_patch.gpu.markdown_table import table_head, table_row
from replayssm_patch.gpu.variants import MODES, SPEC_ARMS

ARM_TITLES = {"native_standard": "native standard", "native_spec": "native spec",
              "replayssm_standard": "ReplaySSM standard", "replayssm_spec": "ReplaySSM spec",
              "replayssm_split_spec": "ReplaySSM split spec", "replayssm_spec_l28": "ReplaySSM spec, L 28",
              "replayssm_split_spec_l28": "ReplaySSM split spec, L 28",
              "replayssm_spec_l28_per_group": "ReplaySSM spec, L 28, a build per group"}  # fmt: skip
RATIOS = (
    ("replayssm_spec", "native_spec"), ("replayssm_spec", "native_standard"), ("replayssm_split_spec", "native_spec"),
    ("replayssm_spec_l28", "native_spec"), ("replayssm_split_spec_l28", "native_spec"),
    ("replayssm_spec_l28", "replayssm_spec_l28_per_group"),
)  # fmt: skip
NONE = "–"

Setting = tuple[str, int, float | None]  # (mode, k, configured AL); k 0: standard decode only


def _settings(rows: Sequence[dict[str, Any]]) -> list[Setting]:
    """Every (mode, k, AL) the spec rows hold; a mode with standard rows only gives (mode, 0, None)."""
    spec = {(r["mode"], r["spec_tokens"], r["acceptance_length_configured"]) for r in rows if r["spec_tokens"]}
    plain = {(r["mode"], 0, None) for r in rows} - {(mode, 0, None) for mode, _, _ in spec}
    rank = list(MODES)
    return sorted(spec | plain, key=lambda s: (rank.index(s[0]) if s[0] in rank else len(rank), s[1], s[2] or 0.0))


def _in_setting(row: dict[str, Any], setting: Setting) -> bool:
    mode, tokens, length = setting
    if row["mode"] != mode:
        return False
    return not row["spec_tokens"] or (row["spec_tokens"], row["acceptance_length_configured"]) == (tokens, length)


def _cell(row: dict[str, Any] | None) -> str:
    if row is None or row.get("tokens_per_s") is None:
        return NONE
    inside = [f"{row['step_ms']:.2f} ms" if row.get("step_ms") is not None else "step ?"]
    if row.get("window_tokens_per_s") is not None:
        inside.insert(0, f"window {row['window_tokens_per_s']:,.0f}")
    if row["spec_tokens"]:
        measured = row.get("acceptance_length_measured")
        inside.append(NONE if measured is None else f"AL {measured:.2f}")
    return f"{row['tokens_per_s']:,.0f} ({', '.join(inside)})" + ("" if row["valid"] else " **invalid**")


def speed_ratio(over: dict[str, Any] | None, under: dict[str, Any] | None) -> float | None:
    """tokens/s of `over` / `under`, only when both rows are there and valid."""
    if over is None or under is None or not (over["valid"] and under["valid"]):
        return None
    if not over.get("tokens_per_s") or not under.get("tokens_per_s"):
        return None
    return over["tokens_per_s"] / under["tokens_per_s"]


def concurrency(native: dict[str, Any] | None, replay: dict[str, Any] | None) -> str:
    """'native → ReplaySSM (ratio×)' of the rows' maximum concurrency."""
    values = [None if r is None else r.get("max_concurrency") for r in (native, replay)]
    shown = " → ".join(NONE if v is None else f"{v:,.1f}" for v in values)
    if None in values or not values[0]:
        return shown
    return f"{shown} ({values[1] / values[0]:.2f}×)"


def times_text(value: float | None) -> str:
    """A ratio as "1.23×", or "–" where there is none (shared by the engine-step summary)."""
    return NONE if value is None else f"{value:.2f}×"


OTHER_HOSTS = "†"
OTHER_HOSTS_NOTE = (
    f"{OTHER_HOSTS} the two rows ran on different GPUs (their gpu_uuid) or days: the ratio mixes hosts, whose steps "
    "have differed by several % (rows before session 22 carry no gpu_uuid, so only their dates can tell)."
)


def other_hosts(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two rows ran on different hosts, as far as they tell: their GPUs' UUIDs where both carry one, else
    their dates (a lent host lasts one session, within a day)."""
    if a is None or b is None:
        return False
    if a.get("gpu_uuid") and b.get("gpu_uuid"):
        return a["gpu_uuid"] != b["gpu_uuid"]
    return a.get("date") != b.get("date")


def setting_table(rows: Sequence[dict[str, Any]], setting: Setting) -> list[str]:
    mode, tokens, length = setting
    mine = [r for r in rows if _in_setting(r, setting)]
    title = f"## {mode} mode, k = {tokens}, AL {length:g} configured" if tokens else f"## {mode} mode, no speculation"
    head = ["batch", *ARM_TITLES.values(), *(f"{ARM_TITLES[a]} / {ARM_TITLES[b]}" for a, b in RATIOS),
            "max concurrency, native spec → ReplaySSM spec"]  # fmt: skip
    lines = [title, "", *table_head(head)]
    mixed = False
    for batch in sorted({r["batch"] for r in mine}):
        by_arm = {r["arm"]: r for r in mine if r["batch"] == batch}
        cells = [str(batch), *(_cell(by_arm.get(arm)) for arm in SPEC_ARMS)]
        for a, b in RATIOS:
            ratio = speed_ratio(by_arm.get(a), by_arm.get(b))
            apart = ratio is not None and other_hosts(by_arm.get(a), by_arm.get(b))
            cells.append(times_text(ratio) + (OTHER_HOSTS if apart else ""))
            mixed |= apart
        cells.append(concurrency(by_arm.get("native_spec"), by_arm.get("replayssm_spec")))
        lines.append(table_row(cells))
    return lines + (["", OTHER_HOSTS_NOTE] if mixed else []) + at_capacity(mine)


def _largest_valid(rows: Sequence[dict[str, Any]], arm: str) -> dict[str, Any] | None:
    valid = [r for r in rows if r["arm"] == arm and r["valid"] and r.get("tokens_per_s")]
    return max(valid, key=lambda r: r["batch"], default=None)


def at_capacity(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Native spec and each ReplaySSM spec arm at the largest valid batch it ran (a `fit` batch is its capacity,
    down to a multiple of FIT_STEP) and their ratio: the comparison a capacity gain makes, which the per-batch ratios
    cannot show where native does not fit."""
    native = _largest_valid(rows, "native_spec")
    largest = [(arm, _largest_valid(rows, arm)) for arm, under in RATIOS if under == "native_spec"]
    compared = [(arm, row) for arm, row in largest if row is not None and native is not None]
    if not any(row["batch"] != native["batch"] for _, row in compared):
        return []

    def shown(row: dict[str, Any]) -> str:
        full = row.get("max_concurrency") is not None and row["batch"] + FIT_STEP > row["max_concurrency"]
        return f"batch {row['batch']}{' (its capacity)' if full else ''}: {row['tokens_per_s']:,.0f} tok/s"

    arms = [
        f"{ARM_TITLES[arm]} {shown(row)}, {row['tokens_per_s'] / native['tokens_per_s']:.2f}×"
        + (" (another host)" if other_hosts(native, row) else "")
        for arm, row in compared
    ]  # fmt: skip
    return ["", f"Largest batch each ran, over native spec's: native spec {shown(native)}; {'; '.join(arms)}."]


def _setting_words(row: dict[str, Any]) -> str:
    return f", k {row['spec_tokens']}, AL {row['acceptance_length_configured']:g}" if row["spec_tokens"] else ""


def conditions_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Where each row that kept its conditions ran: its GPU, the SM clock against its maximum and the host's probe
    time. Why: a ratio is only as good as its two rows' hosts, and in session 24 one engine ran host-bound on a host
    whose CPU share, load and steal looked like every other's."""
    kept = [r for r in rows if r.get("conditions")]
    if not kept:
        return []
    lines = ["", "Where the rows ran (the rows that keep their conditions):", ""]
    for r in kept:
        c = r["conditions"]
        facts = [f"GPU …{r['gpu_uuid'][-7:]}" if r.get("gpu_uuid") else "GPU not named"]
        if c.get("gpu_clock_share") is not None:
            facts.append(f"SM clock {c['gpu_clock_share']:.2f} of its maximum")
        if c.get("host_probe_ms") is not None:
            facts.append(f"host probe {c['host_probe_ms']:.1f} ms")
        lines.append(f"- {r['arm']} {r['mode']}{_setting_words(r)}, batch {r['batch']}: {', '.join(facts)}")
    return lines


def summary_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """Every setting's table, then the invalid rows with their problems and where the rows ran."""
    lines = [
        "# Speculative decoding, engine-side (replayssm_patch/gpu/spec_step.py)",
        "",
        "Output tokens/s = B · 256 / (t272 − t16); in brackets the tokens/s of the whole-batch decode window on the "
        "engine's clock (no prefill inside; rows measured since it exists), the time per engine step and, for a "
        "spec arm, the acceptance length measured from vllm:spec_decode_*. Ratios only between valid rows; max "
        "concurrency = vLLM's requests of max_model_len tokens that the KV cache holds.",
    ]
    for setting in _settings(rows):
        lines += ["", *setting_table(rows, setting)]
    invalid = [r for r in rows if not r["valid"]]
    if invalid:
        lines += ["", "Invalid rows:", ""]
        for r in invalid:
            lines.append(f"- {r['arm']} {r['mode']}{_setting_words(r)}, batch {r['batch']}: {'; '.join(r['problems'])}")
    return "\n".join(lines + conditions_lines(rows)) + "\n"
