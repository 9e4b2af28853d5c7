"""`--workers auto`: enough sender processes that none of them spends more than TARGET_BUSY of its time reading.

A worker's event loop stamps each streamed chunk when it gets to it; a loop that is busy most of the time
gets there late (receive lag, harness/replay/loop_probe.py). The count is

    workers = ceil(peak_event_rate × event_cost_s / TARGET_BUSY), clamped to [1, min(usable cores, requests)]

- `peak_event_rate`: the trace's largest number of expected streamed events in any WINDOW_S window, per
  second, on the replayed (time-scaled) schedule. Request i brings `output_tokens_i + EVENTS_PER_REQUEST`
  events (one chunk per token, plus the response head and the final usage / `[DONE]` chunk) spread evenly
  over its expected decode time `output_tokens_i × ASSUMED_TPOT_S` from its send. The server's real pace is
  unknown before the run; the long-run event rate does not depend on it (tokens asked for per second), only
  how sharp the peaks are, and a pace faster than the server's overstates them, so the guess errs on the
  side of more workers.
- `event_cost_s`: measured at start-up in this process: the time to parse CALIBRATION_CHUNKS synthetic SSE
  chunks (vLLM-shaped completions chunks with continuous usage) with the replay's own stream reader, best of
  CALIBRATION_ROUNDS, times READ_OVERHEAD for the rest of a wake-up (socket read, aiohttp, the task
  switch). READ_OVERHEAD is the ratio of a worker's CPU per received chunk (CPU share × wall / chunks,
  streams paced at 2-5 ms per token) to the parse time alone, measured on a 2-core box: 23-37 µs against 4-6 µs.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from harness.replay.options import ReplayOptions
from harness.replay.payloads import PreparedRequest
from harness.replay.result_row import ResultRow
from harness.replay.stream_parse import StreamReader

META_WORKERS_AUTO = "replaybench.workers_auto"  # JSON: the inputs `--workers auto` sized the count from

ASSUMED_TPOT_S = 0.01  # a fast GPU decode step (H200, batch 64: 9.4 ms)
WINDOW_S = 1.0
EVENTS_PER_REQUEST = 2
# A loop a quarter busy seldom has one step's burst of chunks still queued when the next arrives (at 256
# streams one step's chunks alone take ~7 ms to read in one worker).
TARGET_BUSY = 0.25
READ_OVERHEAD = 6.0
CALIBRATION_CHUNKS = 1000
CALIBRATION_ROUNDS = 3


def _ramp_sum(x: np.ndarray, points: np.ndarray, slopes: np.ndarray) -> np.ndarray:
    """Σ_i slopes_i · max(0, x - points_i) at every x, in O((n + m) log n) (`points` sorted ascending)."""
    prefix_slope = np.concatenate([[0.0], np.cumsum(slopes)])
    prefix_moment = np.concatenate([[0.0], np.cumsum(slopes * points)])
    upto = np.searchsorted(points, x, side="right")
    return x * prefix_slope[upto] - prefix_moment[upto]


def peak_event_rate(
    intended_s: Sequence[float] | np.ndarray,
    output_tokens: Sequence[int] | np.ndarray,
    tpot_s: float = ASSUMED_TPOT_S,
    window_s: float = WINDOW_S,
) -> float:
    """Events per second in the busiest `window_s` window, each request's events spread evenly over its decode.

    Exact: the number of events in [t, t + window_s] is piecewise linear in t, so its maximum lies where t or
    t + window_s meets the start or end of some request's decode; every such t is evaluated.
    """
    start = np.asarray(intended_s, dtype=float)
    if not len(start):
        return 0.0
    tokens = np.maximum(np.asarray(output_tokens, dtype=float), 1.0)
    end = start + tokens * tpot_s
    rate = (tokens + EVENTS_PER_REQUEST) / (end - start)  # events per second of each request while it decodes
    by_start, by_end = np.argsort(start), np.argsort(end)

    def events_before(x: np.ndarray) -> np.ndarray:
        return _ramp_sum(x, start[by_start], rate[by_start]) - _ramp_sum(x, end[by_end], rate[by_end])

    edges = np.concatenate([start, end])
    candidates = np.concatenate([edges, edges - window_s])
    return float(np.max(events_before(candidates + window_s) - events_before(candidates))) / window_s


def synthetic_chunks(count: int) -> list[bytes]:
    """`count` SSE events shaped like vLLM's completions stream with continuous usage: one token each."""
    chunks = []
    for i in range(count):
        chunk = {
            "id": "cmpl-0123456789abcdef0123456789abcdef",
            "object": "text_completion",
            "created": 1_700_000_000,
            "model": "calibration-model",
            "choices": [{"index": 0, "text": " word", "logprobs": None, "finish_reason": None, "stop_reason": None}],
            "usage": {"prompt_tokens": 100, "total_tokens": 101 + i, "completion_tokens": 1 + i},
        }
        chunks.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    return chunks


def measured_event_cost_s(chunks: int = CALIBRATION_CHUNKS) -> float:
    """Seconds one streamed event costs a worker here: parse time per synthetic chunk × READ_OVERHEAD."""
    events = synthetic_chunks(chunks)
    best = math.inf
    for _ in range(CALIBRATION_ROUNDS):
        row = ResultRow(
            request_id="calibration",
            arm="",
            repeat=0,
            intended_s=0.0,
            worker=0,
            prompt_tokens=100,
            expected_output_tokens=chunks,
        )
        reader = StreamReader(row, keep_text=False)
        began = time.perf_counter()
        for i, event in enumerate(events):
            reader.feed_bytes(event, i * 1e-3)
        best = min(best, (time.perf_counter() - began) / chunks)
    return best * READ_OVERHEAD


def auto_worker_count(peak_rate: float, event_cost_s: float, cores: int, requests: int) -> int:
    """The formula of the module docstring."""
    wanted = math.ceil(peak_rate * event_cost_s / TARGET_BUSY)
    return max(1, min(wanted, cores, requests))


def size_workers(options: ReplayOptions, requests: list[PreparedRequest], cores: int) -> ReplayOptions:
    """`options` with `workers = "auto"` resolved for these (time-scaled) requests; the inputs go to metadata."""
    if options.workers != "auto":
        return options
    peak = peak_event_rate([r.intended_s for r in requests], [r.expected_output_tokens for r in requests])
    cost = measured_event_cost_s()
    workers = auto_worker_count(peak, cost, cores, len(requests))
    sizing = {"peak_event_rate": peak, "event_cost_s": cost, "target_busy": TARGET_BUSY, "cores": cores}
    return replace(
        options,
        workers=workers,
        extra_metadata=options.extra_metadata | {META_WORKERS_AUTO: json.dumps(sizing | {"workers": workers})},
    )
