"""Read an OpenAI-style response (SSE stream or one JSON body) into the fields of a `ResultRow`.

A streamed chunk counts as one token when its choice carries non-empty text (`text` for completions,
`delta.content` for chat); a chat stream's role-only first chunk and the final usage chunk carry none.
"""

from __future__ import annotations

import json
from typing import Any

from harness.replay.result_row import ResultRow


def _choice_text(choice: dict[str, Any]) -> str | None:
    if "text" in choice:
        return choice["text"]
    holder = choice.get("delta") or choice.get("message") or {}
    return holder.get("content")


def _apply_usage(row: ResultRow, usage: dict[str, Any] | None) -> None:
    if usage:
        row.output_tokens_usage = usage.get("completion_tokens")
        row.prompt_tokens_server = usage.get("prompt_tokens")


class StreamReader:
    """Feeds SSE lines into `row` as they arrive; `done` once `data: [DONE]` was seen."""

    def __init__(self, row: ResultRow, keep_text: bool) -> None:
        self.row = row
        self.row.token_times = []
        self.keep_text = keep_text
        self.parts: list[str] = []
        self.done = False
        self.server_error: str | None = None  # an `error` event inside the stream
        self._partial = b""

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
        _apply_usage(self.row, chunk.get("usage"))
        for choice in chunk.get("choices") or ():
            piece = _choice_text(choice)
            if piece:
                self.row.token_times.append(since_send_s)
                if self.keep_text:
                    self.parts.append(piece)
            if choice.get("finish_reason"):
                self.row.finish_reason = choice["finish_reason"]

    def finish(self) -> None:
        times = self.row.token_times or []
        self.row.output_tokens = len(times)
        self.row.ttft_s = times[0] if times else None
        if self.keep_text:
            self.row.output_text = "".join(self.parts)


def read_whole(row: ResultRow, body: bytes, keep_text: bool) -> None:
    """A non-streamed answer: finish reason, usage and text; TTFT and token times are not observable."""
    answer = json.loads(body)
    _apply_usage(row, answer.get("usage"))
    choices = answer.get("choices") or [{}]
    row.finish_reason = choices[0].get("finish_reason")
    if keep_text:
        row.output_text = _choice_text(choices[0]) or ""
