"""The decode step read off the engine's own clock: the steps in which the whole batch decoded and nothing else ran.

Why: (t272 - t16) / 256 cancels the prefill only on average. At batch 256 the 256 x 1,024-token prefill takes
seconds and its run-to-run jitter lands in the step (on the H200 both arms' repeats spread 2-3 ms at 128-256,
as wide as the effect sought). vLLM stamps every batch of engine-core outputs with the core's monotonic clock
(``RequestOutput.metrics.last_token_ts`` of each request in it), so the time between two consecutive output
batches is one engine step, measured where the step runs. The window opens at the step in which the last
request got its first token (every prefill is done) and closes at the step in which the first request got its
last token (the batch is still whole); every step in it must carry all B requests. Its periods are pure
decode steps at batch B, flush steps included (the mean is the step the issue asks for; p50/p90/max show stalls),
and the tokens they emit over the window's length are its throughput (under speculation: the accepted tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class EngineStep:
    """One batch of engine-core outputs as the client saw it."""

    stamp_s: float  # the engine core's timestamp of the batch
    rows: int  # requests with new tokens in it
    tokens: int  # new tokens, all requests together (under speculation up to 1 + k per request)
    started: int  # of them, requests whose first token it holds
    finished: int  # of them, requests whose last token it holds


def observed_step(outputs: Sequence[Any], seen: set[str]) -> EngineStep:
    """One step's DELTA outputs (vLLM RequestOutputs) as an EngineStep; ``seen`` holds the request ids that had put
    out a token before, and gains this step's. The stamp is read now: the stats object is live."""
    started = sum(o.request_id not in seen for o in outputs)
    seen.update(o.request_id for o in outputs)
    return EngineStep(
        stamp_s=getattr(outputs[0].metrics, "last_token_ts", 0.0),
        rows=len(outputs),
        tokens=sum(len(o.outputs[0].token_ids) for o in outputs),
        started=started,
        finished=sum(bool(o.finished) for o in outputs),
    )


@dataclass(frozen=True)
class DecodeWindow:
    """The periods between consecutive engine steps while all B requests decoded (milliseconds)."""

    steps: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    max_ms: float
    tokens_per_s: float  # every token emitted inside the window over its length: B / step without speculation
    # each period and the tokens the step closing it emitted, in order: whether slow steps recur with the ring's
    # period (a cohort of rows folding together) or stand alone (a stall) shows only in the sequence
    periods_ms: tuple[float, ...] = ()
    step_tokens: tuple[int, ...] = ()


def decode_window(steps: Sequence[EngineStep], batch: int) -> DecodeWindow | None:
    """The whole-batch decode window of one generate, or None when it has no period (the batch never decoded
    whole: a short generate at a large batch, a batch run in waves, or no engine timestamps)."""
    started = np.cumsum([s.started for s in steps])
    finishing = [i for i, s in enumerate(steps) if s.finished]
    if not steps or started[-1] < batch or not finishing:
        return None
    first, last = int(np.argmax(started >= batch)), finishing[0]
    inside = steps[first : last + 1]
    if last <= first or any(s.rows != batch for s in inside[1:]) or any(s.stamp_s <= 0 for s in inside):
        return None
    periods_ms = np.diff([s.stamp_s for s in inside]) * 1e3
    emitted = sum(s.tokens for s in inside[1:])
    return DecodeWindow(
        steps=len(periods_ms),
        mean_ms=round(float(periods_ms.mean()), 4),
        p50_ms=round(float(np.percentile(periods_ms, 50)), 4),
        p90_ms=round(float(np.percentile(periods_ms, 90)), 4),
        max_ms=round(float(periods_ms.max()), 4),
        tokens_per_s=round(emitted * 1e3 / float(periods_ms.sum()), 1),
        periods_ms=tuple(round(float(ms), 3) for ms in periods_ms),
        step_tokens=tuple(s.tokens for s in inside[1:]),
    )
