"""Read an OpenAI-style response (SSE stream or one JSON body) into the fields of a `ResultRow`.

Tokens are counted from the server, never from text: a chunk's text can be empty although it carries a
token (special tokens, byte-fallback pieces that complete a character later, reasoning markers), and one
chunk can carry several tokens (speculative decoding, `--stream-interval`, a lagging frontend). Where they
come from, best first (`token_count_source`):

- `continuous_usage`: cumulative `usage.completion_tokens` in every chunk (vLLM/SGLang
  `stream_options.continuous_usage_stats`); a chunk carries the increase since the previous one.
- `final_usage`: only the last usage chunk counts tokens; each chunk with a choice that is not a chat
  role-only opener counts as one token for timing, and the request's total is the server's.
- `chunks`: no usage at all; chunks counted as above.

A chunk whose text is empty and which also ends the stream (`finish_reason`) is ambiguous without usage
per chunk; it counts as a token only if the final usage says a token is still missing.
"""

from __future__ import annotations

import json
from typing import Any

from harness.records.result_schema import CHUNKS, CONTINUOUS_USAGE, FINAL_USAGE
from harness.replay.result_row import ResultRow


def _choice_text(choice: dict[str, Any]) -> str | None:
    if "text" in choice:
        return choice["text"]
    holder = choice.get("delta") or choice.get("message") or {}
    return holder.get("content")


def _role_only(choice: dict[str, Any]) -> bool:
    """A chat stream's opener announces the role and carries no generated token."""
    delta = choice.get("delta") or {}
    return "role" in delta and not delta.get("content")


def _apply_usage(row: ResultRow, usage: dict[str, Any] | None) -> None:
    if usage:
        row.output_tokens_usage = usage.get("completion_tokens")
        row.prompt_tokens_server = usage.get("prompt_tokens")


class StreamReader:
    """Feeds SSE lines into `row` as they arrive; `done` once `data: [DONE]` was seen."""

    def __init__(self, row: ResultRow, keep_text: bool) -> None:
        self.row = row
        self.row.token_times = []
        self.row.token_counts = []
        self.keep_text = keep_text
        self.parts: list[str] = []
        self.done = False
        self.server_error: str | None = None  # an `error` event inside the stream
        self._partial = b""
        self._continuous = False  # some choice chunk carried cumulative usage
        self._cumulative = 0
        self._ambiguous_end: float | None = None  # time of an empty-text chunk that only ended the stream

    def feed_bytes(self, data: bytes, since_send_s: float) -> None:
        """Bytes as they arrived (any split); events completed by them are stamped with this arrival time."""
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            self.feed(line, since_send_s)

    def feed(self, line: bytes, since_send_s: float) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        chunk = json.loads(payload)
        if "error" in chunk:
            self.server_error = str(chunk["error"])
            return
        usage = chunk.get("usage")
        _apply_usage(self.row, usage)
        choices = chunk.get("choices") or ()
        if choices and usage and usage.get("completion_tokens") is not None:
            self._count_from_usage(int(usage["completion_tokens"]), since_send_s)
        for choice in choices:
            piece = _choice_text(choice)
            finish = choice.get("finish_reason")
            if not self._continuous and not _role_only(choice):
                self._count_from_chunk(piece, finish, since_send_s)
            if piece and self.keep_text:
                self.parts.append(piece)
            if finish:
                self.row.finish_reason = finish

    def _count_from_usage(self, cumulative: int, since_send_s: float) -> None:
        if not self._continuous:  # chunks counted before usage appeared are recounted from it
            self._continuous = True
            self.row.token_times, self.row.token_counts = [], []
            self._ambiguous_end = None
        added = cumulative - self._cumulative
        if added > 0:
            self.row.token_times.append(since_send_s)
            self.row.token_counts.append(added)
            self._cumulative = cumulative

    def _count_from_chunk(self, piece: str | None, finish: str | None, since_send_s: float) -> None:
        if piece is None and finish is None:
            return
        if not piece and finish:
            self._ambiguous_end = since_send_s
            return
        self.row.token_times.append(since_send_s)
        self.row.token_counts.append(1)

    def finish(self) -> None:
        row = self.row
        times, counts = row.token_times or [], row.token_counts or []
        usage_total = row.output_tokens_usage
        if self._continuous:
            row.token_count_source = CONTINUOUS_USAGE
        else:
            row.token_count_source = FINAL_USAGE if usage_total is not None else CHUNKS
            if self._ambiguous_end is not None and usage_total is not None and len(times) < usage_total:
                times.append(self._ambiguous_end)
                counts.append(1)
        counted = sum(counts)
        row.output_tokens = usage_total if row.token_count_source == FINAL_USAGE else counted
        row.ttft_s = times[0] if times else None
        if self.keep_text:
            row.output_text = "".join(self.parts)


def read_whole(row: ResultRow, body: bytes, keep_text: bool) -> None:
    """A non-streamed answer: finish reason, usage and text; TTFT and token times are not observable."""
    answer = json.loads(body)
    _apply_usage(row, answer.get("usage"))
    choices = answer.get("choices") or [{}]
    row.finish_reason = choices[0].get("finish_reason")
    row.output_tokens = row.output_tokens_usage
    row.token_count_source = FINAL_USAGE if row.output_tokens_usage is not None else None
    if keep_text:
        row.output_text = _choice_text(choices[0]) or ""
