""" "Review before expanding": the requests and trace windows where the candidate lost most, paired by request.

Pairing is by request id within a repeat (both arms replayed the same request at the same trace time), and
per-request ratios are combined over repeats with a geometric mean so one noisy repeat cannot dominate.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from harness.analysis.model import ReviewRequest, ReviewWindow
from harness.analysis.request_pairing import paired_requests
from harness.analysis.run_metrics import RunMetrics, TimeBlocks


def _paired_frame(pairs: list[tuple[RunMetrics, RunMetrics]]) -> pd.DataFrame:
    trace_columns = ("intended_s", "block", "prompt_tokens", "output_tokens")
    frames = [paired_requests(b, c, ["ttft_s", "e2e_s"], trace_columns) for b, c in pairs]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["request_id", *trace_columns])


def _outputs(run: RunMetrics, request_ids: list[str]) -> dict[str, str | None]:
    """Saved output text of a few requests, read from the result file only when the review needs it."""
    if not request_ids:
        return {}
    try:
        table = pq.read_table(
            run.path,
            columns=["request_id", "output_text"],
            filters=pc.field("request_id").isin(pa.array(request_ids, pa.string())),
        )
    except (OSError, ValueError, pa.ArrowException):
        return {}
    return dict(zip(table.column("request_id").to_pylist(), table.column("output_text").to_pylist(), strict=True))


def review_tables(
    pairs: list[tuple[RunMetrics, RunMetrics]], blocks: TimeBlocks, top: int = 10
) -> tuple[list[ReviewRequest], list[ReviewWindow]]:
    """Top `top` requests by paired E2E regression and top windows by paired TTFT regression (slower ones only)."""
    frame = _paired_frame(pairs)
    if frame.empty:
        return [], []
    with np.errstate(divide="ignore", invalid="ignore"):
        frame["log_e2e"] = np.log(frame["e2e_s_c"]) - np.log(frame["e2e_s_b"])
        frame["log_ttft"] = np.log(frame["ttft_s_c"]) - np.log(frame["ttft_s_b"])
    frame = frame.replace([np.inf, -np.inf], np.nan)
    per_request = (
        frame.groupby("request_id")
        .agg(
            log_e2e=("log_e2e", "mean"),
            e2e_b=("e2e_s_b", "median"),
            e2e_c=("e2e_s_c", "median"),
            prompt_tokens=("prompt_tokens", "first"),
            output_tokens=("output_tokens", "first"),
        )
        .nlargest(top, "log_e2e")
    )
    per_request = per_request[per_request["log_e2e"] > 0]  # only requests that really got slower
    worst = list(per_request.index)
    last_pair = pairs[-1]
    base_text, cand_text = _outputs(last_pair[0], worst), _outputs(last_pair[1], worst)

    def as_int(value: float) -> int | None:
        return int(value) if np.isfinite(value) else None

    requests = [
        ReviewRequest(
            request_id=rid,
            metric="e2e",
            baseline_s=float(row.e2e_b),
            candidate_s=float(row.e2e_c),
            ratio=float(np.exp(row.log_e2e)),
            prompt_tokens=as_int(row.prompt_tokens),
            output_tokens=as_int(row.output_tokens),
            baseline_output=base_text.get(rid),
            candidate_output=cand_text.get(rid),
        )
        for rid, row in per_request.iterrows()
    ]
    per_window = (
        frame.groupby("block")
        .agg(log_ttft=("log_ttft", "mean"), log_e2e=("log_e2e", "mean"), requests=("request_id", "nunique"))
        .nlargest(min(top, 5), "log_ttft")
    )
    per_window = per_window[(per_window["log_ttft"] > 0) | (per_window["log_e2e"] > 0)]
    windows = [
        ReviewWindow(
            start_s=blocks.start_s + block * blocks.block_s,
            end_s=blocks.start_s + (block + 1) * blocks.block_s,
            requests=int(row.requests),
            ttft_ratio=float(np.exp(row.log_ttft)),
            e2e_ratio=float(np.exp(row.log_e2e)),
        )
        for block, row in per_window.iterrows()
    ]
    return requests, windows
