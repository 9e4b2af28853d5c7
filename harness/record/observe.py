"""Watch a response on its way to the client: first-token time, usage, finish reason.

`SseObserver` also removes what the proxy itself caused: when the client streamed without asking for usage,
the proxy asked the upstream for `stream_options.include_usage`, so the usage-only chunk (and any
`"usage": null` member the upstream adds to other chunks) is cut out before the client sees the stream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from harness.record.sse import complete_prefix_end, events, json_payload, without_key

_TOKEN_DELTA_KEYS = ("content", "reasoning_content", "reasoning", "tool_calls", "function_call", "refusal")


@dataclass
class ResponseOutcome:
    first_token_at: float | None = None  # time.monotonic() when the first token-carrying chunk arrived
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    token_chunks: int = 0  # stream chunks that carried tokens (fallback output count when usage is missing)

    def observe(self, obj: dict[str, Any], now: float) -> None:
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens = _int_or(usage.get("prompt_tokens"), self.prompt_tokens)
            self.completion_tokens = _int_or(usage.get("completion_tokens"), self.completion_tokens)
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return
        carries = False
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            carries = carries or _carries_tokens(choice)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        if carries:
            self.token_chunks += 1
            if self.first_token_at is None:
                self.first_token_at = now


def _int_or(value: Any, default: int | None) -> int | None:
    return value if isinstance(value, int) else default


def _carries_tokens(choice: dict[str, Any]) -> bool:
    if choice.get("text"):
        return True
    delta = choice.get("delta") or choice.get("message")
    return isinstance(delta, dict) and any(delta.get(key) for key in _TOKEN_DELTA_KEYS)


class SseObserver:
    """Streams: passes bytes through as they come, or whole events at a time when it must strip usage."""

    def __init__(self, strip_usage: bool) -> None:
        self.outcome = ResponseOutcome()
        self._strip = strip_usage
        self._pending = b""

    def feed(self, chunk: bytes, now: float) -> bytes:
        data = self._pending + chunk if self._pending else chunk
        end = complete_prefix_end(data)
        self._pending = data[end:]
        kept = self._process(data[:end], now) if end else b""
        return kept if self._strip else chunk

    def close(self, now: float) -> bytes:
        """The bytes still held back at the end of the stream (an unterminated last event)."""
        rest, self._pending = self._pending, b""
        kept = self._process(rest, now) if rest.strip() else rest
        return kept if self._strip else b""

    def _process(self, data: bytes, now: float) -> bytes:
        """Observe each event of `data`; when stripping, return the events as the client must see them."""
        out: list[bytes] = []
        for event in events(data) or [data]:
            obj = json_payload(event)
            if obj is not None:
                self.outcome.observe(obj, now)
            if self._strip:
                out.append(event if obj is None else self._without_usage(event, obj))
        return b"".join(out)

    def _without_usage(self, event: bytes, obj: dict[str, Any]) -> bytes:
        if "usage" not in obj:
            return event
        if obj.get("choices") == [] and isinstance(obj["usage"], dict):
            return b""  # the usage-only chunk the proxy asked for
        data_lines = [i for i, line in enumerate(event.split(b"\n")) if line.startswith(b"data:")]
        if len(data_lines) != 1:  # a multi-line data field: rebuild the event, compactly
            return b"data: " + _compact_without_usage(obj) + b"\n\n"
        start = 0 if event.startswith(b"data:") else event.index(b"\ndata:") + 1
        start += 5 + (event[start + 5 : start + 6] == b" ")
        end = event.index(b"\n", start)
        end -= event[end - 1 : end] == b"\r"
        edited = without_key(event[start:end], obj, "usage")
        if edited is None:  # the member could not be cut exactly: re-serialise without it
            edited = _compact_without_usage(obj)
        return event[:start] + edited + event[end:]


def _compact_without_usage(obj: dict[str, Any]) -> bytes:
    return json.dumps({k: v for k, v in obj.items() if k != "usage"}, separators=(",", ":")).encode()


class BodyObserver:
    """Whole (non-streamed) responses: passes bytes through, keeps up to `cap` bytes to read usage at the end."""

    def __init__(self, cap: int) -> None:
        self.outcome = ResponseOutcome()
        self._cap = cap
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes, now: float) -> bytes:
        if self._size <= self._cap:
            self._parts.append(chunk)
            self._size += len(chunk)
        return chunk

    def close(self, now: float) -> bytes:
        if self._size <= self._cap:
            try:
                body = json.loads(b"".join(self._parts))
            except ValueError:
                body = None
            if isinstance(body, dict):
                self.outcome.observe(body, now)
        return b""
