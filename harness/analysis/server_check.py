"""Cross-check one run's client-measured latencies against the server's own `/metrics` (issue 13).

A harness is only as good as its clock: if the client's mean TPOT differs from the one the server's engine
stamped, the client's per-token numbers are suspect. What each direction means:

- client above the server by more than `[decision] server_tpot_tolerance`: the client sees the decode
  later or more spread out than the engine stamped it, or divides it by fewer tokens. The harness's clock
  (a receive loop behind the stream) or its token counting (chunks counted as tokens) lags the server.
  Delays in the API server's detokenize-and-send path after the engine core's stamp look the same.
- client below the server: the client received the tokens faster than the engine claims it made them.
  The server's mean holds requests or time the client did not measure (failed or aborted requests), or its
  API server held tokens back and sent them in bursts: server-side.

Either is a fidelity *warning*: the run stays valid (the paired comparison is unaffected when both arms
share the bias), but the report says which side is slow. Client means use the same successful requests as
the rest of the analysis; the client's mean ITL is the token-weighted TPOT, sum(TPOT x (tokens - 1)) /
sum(tokens - 1): the mean of the per-token ITL samples whenever the first chunk carries one token.
"""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np
import pandas as pd

from harness.analysis.model import CHECK_FIELDS, RunRow, ServerCheck, ServerCheckMeans, SlowSide
from harness.analysis.run_metrics import RunMetrics
from harness.analysis.server_metrics import ServerMeans, Snapshots, means_of


def _mean(values: np.ndarray) -> float | None:
    values = values[np.isfinite(values)]
    return float(values.mean()) if len(values) else None


def client_means(frame: pd.DataFrame) -> dict[str, float | None]:
    """The client's side of CHECK_FIELDS from a per-request frame (`RunMetrics.requests`)."""
    ok = frame["ok"].to_numpy()
    sent = np.isfinite(frame["sent_s"].to_numpy())
    tpot = np.where(ok, frame["tpot_s"].to_numpy(), np.nan)
    gaps = frame["output_tokens"].to_numpy() - 1
    timed = np.isfinite(tpot) & (gaps > 0)
    itl = float((tpot[timed] * gaps[timed]).sum() / gaps[timed].sum()) if timed.any() else None
    return {
        "ttft_mean_s": _mean(np.where(ok, frame["ttft_s"].to_numpy(), np.nan)),
        "tpot_mean_s": _mean(tpot),
        "itl_mean_s": itl,
        "e2e_mean_s": _mean(np.where(ok, frame["e2e_s"].to_numpy(), np.nan)),
        "generated_tokens": float(np.nansum(frame["output_tokens"].to_numpy())),
        "prompt_tokens": float(np.nansum(frame["prompt_tokens"].to_numpy()[sent])),
        "requests": float(sent.sum()),
        "preemptions": None,
        "prefix_cache_hit_rate": None,
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _token_hint(client: float | None, server: float | None, tolerance: float) -> str:
    if client is None or not server or (client > 0 and abs(math.log(client / server)) <= math.log1p(tolerance)):
        return ""
    return f"; the client counted {client:,.0f} output tokens where the server generated {server:,.0f}"


def tpot_flag(
    client: dict[str, float | None], server: dict[str, float | None], tolerance: float
) -> tuple[float | None, SlowSide | None, str]:
    """(client / server mean TPOT, the slow side or None, the warning) for one run."""
    mine, theirs = client["tpot_mean_s"], server["tpot_mean_s"]
    if mine is None or not theirs:
        return None, None, ""
    ratio = mine / theirs
    if abs(math.log(ratio)) <= math.log1p(tolerance):
        return ratio, None, ""
    hint = _token_hint(client["generated_tokens"], server["generated_tokens"], tolerance)
    where = "above" if ratio > 1 else "below"
    head = (
        f"client mean TPOT {_ms(mine)} is {abs(ratio - 1):.1%} {where} the server's {_ms(theirs)} "
        f"(tolerance {tolerance:.0%})"
    )
    if ratio > 1:
        why = (
            "client-side: the client sees tokens later than the engine stamped them, so the harness's clock "
            "or token counting lags the server (or the API server delays tokens after the engine core's stamp)"
        )
        return ratio, "client", f"{head}: {why}{hint}"
    why = (
        "server-side: the engine stamped a slower decode than the client received, so the server's mean holds "
        "requests or time the client did not measure, or its API server sent the tokens in bursts"
    )
    return ratio, "server", f"{head}: {why}{hint}"


def _server_values(means: ServerMeans) -> dict[str, float | None]:
    values = asdict(means)
    return {name: values[name] for name in CHECK_FIELDS}


def server_check(run: RunMetrics, snapshots: Snapshots, tolerance: float) -> ServerCheck:
    """Put the server's means over the run (from its /metrics snapshots) beside the client's."""
    means = means_of(snapshots)
    client, server = client_means(run.requests), _server_values(means)
    ratio, side, warning = tpot_flag(client, server, tolerance)
    notes = list(means.notes)
    if means.missing:
        notes.append(f"the server's /metrics lacks {', '.join(means.missing)}: shown as —")
    return ServerCheck(
        client=client,
        server=server,
        missing=list(means.missing),
        notes=notes,
        tpot_ratio=ratio,
        slow_side=side,
        warning=warning,
    )


def _field_means(checks: list[dict[str, float | None]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name in CHECK_FIELDS:
        values = [c[name] for c in checks if c[name] is not None]
        out[name] = float(np.mean(values)) if values else None
    return out


def arm_means(rows: list[RunRow], arms: tuple[str, ...]) -> dict[str, ServerCheckMeans]:
    """Per arm: every client and server value's mean over the arm's valid runs (per run where defined)."""
    out = {}
    for arm in arms:
        mine = [r.server_check for r in rows if r.arm == arm and r.valid]
        out[arm] = ServerCheckMeans(
            runs=len(mine),
            client=_field_means([c.client for c in mine]),
            server=_field_means([c.server for c in mine]),
            flagged=sum(c.slow_side is not None for c in mine),
        )
    return out
