"""Watch a response on its way to the client: first-token time, usage, finish reason.

`SseObserver` also removes what the proxy itself caused: when the client streamed without asking for usage,
the proxy asked the upstream for `stream_options.include_usage`, so the usage-only chunk (and any
`"usage": null` member the upstream adds to other chunks) is cut out before the client sees the stream.
"""

from __future__ import annotations

import json
from collections import deque
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
    token_chunks: int = 0  # token-carrying chunks: the output length when usage is missing (only then all counted)

    def observe(self, obj: dict[str, Any], now: float) -> None:
        self.take_usage(obj)
        if self.take_choices(obj):
            self.token_chunks += 1
            if self.first_token_at is None:
                self.first_token_at = now

    def take_usage(self, obj: dict[str, Any]) -> None:
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens = _int_or(usage.get("prompt_tokens"), self.prompt_tokens)
            self.completion_tokens = _int_or(usage.get("completion_tokens"), self.completion_tokens)

    def take_choices(self, obj: dict[str, Any]) -> bool:
        """Keep the chunk's (last) finish reason, if it has one; whether it carries tokens."""
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return False
        carries = False
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            carries = carries or _carries_tokens(choice)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return carries


def _int_or(value: Any, default: int | None) -> int | None:
    return value if isinstance(value, int) else default


def _carries_tokens(choice: dict[str, Any]) -> bool:
    if choice.get("text"):
        return True
    delta = choice.get("delta") or choice.get("message")
    return isinstance(delta, dict) and any(delta.get(key) for key in _TOKEN_DELTA_KEYS)


LATER_LIMIT = 64  # reads an SseObserver holds unparsed; past it, the oldest is parsed as each new one comes


class SseObserver:
    """Streams: passes bytes through as they come, or whole events at a time when it must strip usage.

    Events are parsed as they pass only until the first token (its arrival is the TTFT). The next LATER_LIMIT
    reads are kept and parsed when the stream ends, and then only as far as needed: those that mention usage,
    and backwards up to the last finish reason; all of them only when the upstream sent no usage, to count the
    output from the chunks. So a short stream has one or two chunks parsed instead of every one, and a long one
    LATER_LIMIT fewer; events are always observed in stream order, and never many at once.
    """

    def __init__(self, strip_usage: bool) -> None:
        self.outcome = ResponseOutcome()
        self._strip = strip_usage
        self._pending = b""  # an event still missing its end
        self._later: deque[bytes | dict[str, Any]] = deque()  # events after the first token, in order: raw or parsed

    def feed(self, chunk: bytes, now: float) -> bytes:
        if (
            self.outcome.first_token_at is not None
            and not self._pending
            and chunk.endswith(b"\n\n")
            and not (self._strip and b'"usage"' in chunk)
        ):  # the usual chunk: whole events after the first token, nothing to cut - kept for the end, as it is
            self._keep(chunk)
            return chunk
        data = self._pending + chunk if self._pending else chunk
        end = complete_prefix_end(data)
        self._pending = data[end:]
        kept = self._whole(data[:end], now) if end else b""
        return kept if self._strip else chunk

    def close(self, now: float) -> bytes:
        """The bytes still held back at the end of the stream (an unterminated last event)."""
        rest, self._pending = self._pending, b""
        kept = self._whole(rest, now) if rest.strip() else rest
        self._read_later()
        return kept if self._strip else b""

    def _whole(self, data: bytes, now: float) -> bytes:
        """Whole events (or the unterminated tail): read now until the first token, else keep them for later;
        returns them as the client must see them."""
        if self.outcome.first_token_at is None:
            return self._process(data, now)
        if not (self._strip and b'"usage"' in data):
            self._keep(data)
            return data
        out: list[bytes] = []
        for event in events(data) or [data]:
            obj = json_payload(event) if b'"usage"' in event else None
            self._keep(event if obj is None else obj)
            out.append(event if obj is None else self._without_usage(event, obj))
        return b"".join(out)

    def _keep(self, later: bytes | dict[str, Any]) -> None:
        kept = self._later
        kept.append(later)
        if len(kept) > LATER_LIMIT:  # a long stream: memory stays bounded, the order kept
            self._observe(kept.popleft())

    def _observe(self, item: bytes | dict[str, Any]) -> None:
        """Observe a kept item (first_token_at is already set, so the time does not matter)."""
        if isinstance(item, dict):
            self.outcome.observe(item, 0.0)
            return
        for event in events(item) or [item]:
            obj = json_payload(event)
            if obj is not None:
                self.outcome.observe(obj, 0.0)

    def _read_later(self) -> None:
        """Observe the kept events: usage first; then all of them in order when no usage arrived (the output is
        counted from the chunks), else only the last finish reason."""
        for item in [item for item in self._later if isinstance(item, dict) or b'"usage"' in item]:
            for obj in _parsed(item, only_usage=True):
                self.outcome.take_usage(obj)
        if self.outcome.completion_tokens is None:
            for item in self._later:
                self._observe(item)
        else:
            self._take_last_finish_reason()
        self._later.clear()

    def _take_last_finish_reason(self) -> None:
        for item in reversed(self._later):
            for obj in reversed(_parsed(item, only_usage=False)):
                probe = ResponseOutcome()
                probe.take_choices(obj)
                if probe.finish_reason is not None:
                    self.outcome.finish_reason = probe.finish_reason
                    return

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


def _parsed(item: bytes | dict[str, Any], only_usage: bool) -> list[dict[str, Any]]:
    """The JSON objects of a kept item (one parsed event, or raw events); `only_usage`: of events naming usage."""
    if isinstance(item, dict):
        return [item]
    if only_usage and b'"usage"' not in item:
        return []
    found = (json_payload(event) for event in events(item) or [item] if not only_usage or b'"usage"' in event)
    return [obj for obj in found if obj is not None]


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
