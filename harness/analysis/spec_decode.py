"""Speculative decoding as the server counted it, per run, and the acceptance-parity gate of a spec-decode A/B.

Under speculative decoding a faster arm may only be accepting more drafts: a replay bug that makes the text
loop raises acceptance and looks like a speed-up while the steps themselves get slower. So the acceptance is
measured, never taken from the configuration: vLLM 0.24's counters (`vllm/v1/spec_decode/metrics.py`) grow
once per verify step of a request (`vllm:spec_decode_num_drafts`), by its draft tokens and by the ones
accepted, in total and per draft position (`..._per_pos`, label `position`). From their increase over a run:

- acceptance length AL = 1 + accepted / drafts (vLLM's "mean acceptance length": the bonus token included);
- acceptance rate = accepted / draft tokens; per position i: accepted at i / drafts;
- engine steps: observations of `vllm:iteration_tokens_total` (one per step that produced output), per
  second of the run; the mean step time only where a server exposes step durations (the embedded engine's
  `replaybench_sim_step_duration_seconds`; vLLM has none);
- emitted tokens/s: `vllm:generation_tokens_total` over the run; processed tokens/s adds the rejected drafts
  (draft tokens - accepted), i.e. what the target model verified.

The gate compares each arm's AL pooled over its runs in the valid repeat pairs (1 + Σ accepted / Σ drafts).
"""

from __future__ import annotations

from harness.analysis.model import AcceptanceCheck, SpecDecodeRun, Speculation
from harness.analysis.server_metrics import GENERATION_TOKENS, SampleKey, Snapshots

SPEC = "vllm:spec_decode_"
DRAFTS = SPEC + "num_drafts_total"
DRAFT_TOKENS = SPEC + "num_draft_tokens_total"
ACCEPTED = SPEC + "num_accepted_tokens_total"
ACCEPTED_PER_POSITION = SPEC + "num_accepted_tokens_per_pos_total"
ITERATIONS = "vllm:iteration_tokens_total_count"
SIM_STEP = "replaybench_sim_step_duration_seconds"


def _positions(snapshots: Snapshots) -> list[str]:
    after = snapshots.after or {}
    found = {  # the parser names a counter's family with or without `_total`, depending on its TYPE line
        dict(labels).get("position")
        for family, labels in after
        if family.removesuffix("_total") + "_total" == ACCEPTED_PER_POSITION
    }
    return sorted((p for p in found if p is not None), key=int)


def _rate(count: float | None, duration_s: float) -> float | None:
    return count / duration_s if count is not None and duration_s > 0 else None


def _get(totals: dict[SampleKey, float], name: str) -> float | None:
    return totals.get((name, None))


def spec_decode_run(snapshots: Snapshots, duration_s: float, configured: Speculation | None) -> SpecDecodeRun:
    """The run's decoding counters and rates; acceptance None where the server drafted nothing."""
    totals = snapshots.increase()
    if totals is None:
        return SpecDecodeRun(configured=configured, notes=list(snapshots.notes))
    drafts, draft_tokens, accepted = (_get(totals, n) for n in (DRAFTS, DRAFT_TOKENS, ACCEPTED))
    generated, steps = _get(totals, GENERATION_TOKENS), _get(totals, ITERATIONS)
    step_count, step_sum = _get(totals, SIM_STEP + "_count"), _get(totals, SIM_STEP + "_sum")
    notes = []
    if configured is not None and drafts is None:
        notes.append(f"the command configures speculative decoding but /metrics has no {DRAFTS}")
    count, taken = drafts or 0.0, accepted or 0.0
    drafted = count > 0 and accepted is not None
    per_position = [
        _get(snapshots.increase({"position": p}) or {}, ACCEPTED_PER_POSITION) or 0.0 for p in _positions(snapshots)
    ]
    rejected = (draft_tokens or 0.0) - taken if drafted else 0.0
    return SpecDecodeRun(
        configured=configured,
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted_tokens=accepted,
        acceptance_length=1 + taken / count if drafted else None,
        acceptance_rate=taken / draft_tokens if drafted and draft_tokens else None,
        acceptance_by_position=[a / count for a in per_position] if drafted else [],
        engine_steps=steps,
        engine_steps_per_s=_rate(steps, duration_s),
        step_time_mean_s=step_sum / step_count if step_sum is not None and step_count else None,
        emitted_throughput=_rate(generated, duration_s),
        processed_throughput=_rate(None if generated is None else generated + rejected, duration_s),
        notes=notes,
    )


def pooled_acceptance_length(runs: list[SpecDecodeRun]) -> float | None:
    """1 + Σ accepted / Σ drafts over the runs that drafted; None when none did."""
    drafted = [r for r in runs if r.acceptance_length is not None]
    drafts = sum(r.drafts or 0.0 for r in drafted)
    return 1 + sum(r.accepted_tokens or 0.0 for r in drafted) / drafts if drafts else None


def _configured(runs: list[SpecDecodeRun]) -> float | None:
    values = {r.configured.acceptance_length for r in runs if r.configured is not None}
    return values.pop() if len(values) == 1 else None


def acceptance_check(runs: dict[str, list[SpecDecodeRun]], tolerance: float) -> AcceptanceCheck:
    """Compare the arms' pooled measured AL (`runs`: arm -> its runs in the valid repeat pairs, baseline first)."""
    arms = tuple(runs)
    measured = {arm: pooled_acceptance_length(mine) for arm, mine in runs.items()}
    configured = {arm: _configured(mine) for arm, mine in runs.items()}
    base, cand = measured[arms[0]], measured[arms[-1]]
    shown = " vs ".join(f"{arm} {_al(measured[arm])}" for arm in arms)
    line, matched = "", None
    if base is not None and cand is not None:
        apart = abs(cand / base - 1)
        matched = apart <= tolerance
        line = f"measured acceptance length {shown} ({apart:.1%} apart; tolerance {tolerance:.0%})"
    elif base is not None or cand is not None:
        speculating = arms[0] if base is not None else arms[-1]
        line = (
            f"only the {speculating} speculates ({shown}): the comparison includes speculative decoding itself, "
            "so no acceptance-parity gate applies"
        )
    return AcceptanceCheck(
        acceptance_length=measured, configured=configured, tolerance=tolerance, matched=matched, line=line
    )


def _al(value: float | None) -> str:
    return "none" if value is None else f"AL {value:.3f}"


def acceptance_reason(check: AcceptanceCheck | None) -> str | None:
    """The INVALID reason when the arms' acceptance differs beyond the tolerance, else None."""
    if check is None or check.matched is not False:
        return None
    return (
        f"{check.line}: a speed difference could come from acceptance, not from the serving system; give both "
        "arms the same drafter, k and acceptance (e.g. vLLM's synthetic rejection sampling with one "
        "synthetic_acceptance_length) and re-run, or raise [decision] acceptance_tolerance."
    )
