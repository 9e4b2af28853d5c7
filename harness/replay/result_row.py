"""`ResultRow`: one finished request, field for field the columns of RESULT_SCHEMA (DESIGN §2)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ResultRow:
    """Times are seconds: `intended_s`/`sent_s` after t0, `ttft_s`/`e2e_s`/`token_times` after the send."""

    request_id: str
    arm: str
    repeat: int
    intended_s: float
    worker: int
    prompt_tokens: int
    expected_output_tokens: int
    sent_s: float | None = None
    lag_s: float | None = None
    status: int | None = None
    error: str | None = None  # one of ERROR_CLASSES; None = success
    ttft_s: float | None = None
    e2e_s: float | None = None
    token_times: list[float] | None = None  # one per chunk carrying >= 1 generated token (streaming only)
    token_counts: list[int] | None = None  # tokens each of those chunks carried (stream_parse says how known)
    token_count_source: str | None = None  # continuous_usage | final_usage | chunks (stream_parse)
    output_tokens: int | None = None  # generated tokens, counted by the server where it says
    output_tokens_usage: int | None = None  # the server's `usage.completion_tokens`
    prompt_tokens_server: int | None = None  # the server's `usage.prompt_tokens`
    finish_reason: str | None = None
    output_text: str | None = None  # only with save_outputs
    tenant: str | None = None  # the trace's
