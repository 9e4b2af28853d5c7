"""Logged OpenAI requests, one JSON object per line: a `timestamp` plus the request body.

A line is either `{"timestamp": T, "url": "/v1/chat/completions", "body": {...}}` (the shape of the
OpenAI batch file, with a timestamp) or the body's fields inline next to `timestamp`. T is seconds
(any epoch) or an ISO-8601 datetime. Text, model and sampling parameters are kept. Token counts come
from `prompt_tokens` / `output_tokens` or a logged `usage` object; without them the output length is the
body's `max_tokens` and the prompt length is estimated from the text (4 bytes per token), which the
import summary and the `tokenizer` metadata say.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from harness.errors import UserError
from harness.records.trace_schema import META_CLOCK, META_REDACTION, META_TOKENIZER
from harness.trace.importers.common import (
    ImportOptions,
    ImportResult,
    assemble,
    default_id_prefix,
    import_result,
    iter_jsonl,
    json_number,
)

WHAT = 'a request log JSONL (one {"timestamp": ..., "body": {OpenAI request}} per line)'
ENVELOPE_KEYS = ("timestamp", "url", "body", "session_id", "tenant", "usage", "prompt_tokens", "output_tokens")
CONTENT_KEYS = ("model", "prompt", "messages")
BYTES_PER_TOKEN_ESTIMATE = 4
ESTIMATED_TOKENIZER = f"estimated ({BYTES_PER_TOKEN_ESTIMATE} UTF-8 bytes per token)"


@dataclass
class LoggedRequest:
    """One parsed line."""

    timestamp: float | dt.datetime
    api: str
    model: str | None
    prompt: str | None
    messages: str | None
    params: str
    prompt_tokens: int
    output_tokens: int
    prompt_estimated: bool
    session_id: str | None
    tenant: str | None


def _fail(path: Path, lineno: int, problem: str) -> UserError:
    return UserError(f"{path}:{lineno}: {problem}")


def _timestamp(obj: dict, path: Path, lineno: int) -> float | dt.datetime:
    value = obj.get("timestamp")
    if isinstance(value, str):
        try:
            stamp = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise _fail(
                path,
                lineno,
                f"timestamp {value!r} is not an ISO-8601 datetime; "
                "use e.g. 2024-05-10T12:00:00.123Z or seconds as a number",
            ) from None
        return stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.UTC)
    return json_number(obj, "timestamp", path, lineno, signed=True)


def _optional_text(obj: dict, key: str, path: Path, lineno: int) -> str | None:
    value = obj.get(key)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise _fail(path, lineno, f"field {key!r} must be text, got {type(value).__name__}")


def _content(body: dict, url: str | None, path: Path, lineno: int) -> tuple[str, str | None, str | None]:
    """(api, prompt, messages JSON) of one body."""
    chat = "messages" in body if url is None else "chat" in url
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _fail(path, lineno, "a chat request needs a non-empty 'messages' list; add it to the body")
        return "chat", None, json.dumps(messages, ensure_ascii=False, separators=(",", ":"))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _fail(
            path,
            lineno,
            "a completions request needs a text 'prompt' (token-id and batched prompts "
            "are not supported); give 'prompt' as a string or 'messages' for chat",
        )
    return "completions", prompt, None


def _token_count(obj: dict, key: str, usage_key: str, path: Path, lineno: int) -> int | None:
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else {}
    for source, field in ((obj, key), (usage, usage_key)):
        if source.get(field) is not None:
            return int(json_number(source, field, path, lineno, integer=True))
    return None


def _require_encodable(obj: dict, path: Path, lineno: int) -> None:
    """JSON escapes can smuggle in unpaired surrogates (\\ud800) that no UTF-8 file can hold."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise _fail(path, lineno, "the text holds an unpaired UTF-16 surrogate escape; fix the logged text") from None


def parse_line(obj: dict, path: Path, lineno: int) -> LoggedRequest:
    _require_encodable(obj, path, lineno)
    timestamp = _timestamp(obj, path, lineno)
    body = obj.get("body", {k: v for k, v in obj.items() if k not in ENVELOPE_KEYS})
    if not isinstance(body, dict):
        raise _fail(path, lineno, f"'body' must be a JSON object (the OpenAI request), got {type(body).__name__}")
    url = _optional_text(obj, "url", path, lineno)
    api, prompt, messages = _content(body, url, path, lineno)
    params = {k: v for k, v in body.items() if k not in CONTENT_KEYS}
    output_tokens = _token_count(obj, "output_tokens", "completion_tokens", path, lineno)
    if output_tokens is None:
        limit = next((k for k in ("max_tokens", "max_completion_tokens") if body.get(k) is not None), None)
        if limit is None:
            raise _fail(path, lineno, "no output length: add 'output_tokens', a 'usage' object or 'max_tokens'")
        output_tokens = int(json_number(body, limit, path, lineno, integer=True))
    prompt_tokens = _token_count(obj, "prompt_tokens", "prompt_tokens", path, lineno)
    estimated = prompt_tokens is None
    if estimated:
        text = prompt if prompt is not None else messages or ""
        prompt_tokens = math.ceil(len(text.encode()) / BYTES_PER_TOKEN_ESTIMATE)
    return LoggedRequest(
        timestamp=timestamp,
        api=api,
        model=_optional_text(body, "model", path, lineno),
        prompt=prompt,
        messages=messages,
        params=json.dumps(params, sort_keys=True, ensure_ascii=False),
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        prompt_estimated=estimated,
        session_id=_optional_text(obj, "session_id", path, lineno),
        tenant=_optional_text(obj, "tenant", path, lineno),
    )


def _seconds(requests: list[LoggedRequest], path: Path) -> np.ndarray:
    kinds = {isinstance(r.timestamp, dt.datetime) for r in requests}
    if len(kinds) > 1:
        raise UserError(f"{path}: timestamps mix numbers and ISO-8601 text; use one form for the whole file")
    if kinds == {True}:
        first = requests[0].timestamp
        return np.array([(r.timestamp - first).total_seconds() for r in requests], dtype=np.float64)
    return np.array([r.timestamp for r in requests], dtype=np.float64)


def import_openai_jsonl(path: Path, options: ImportOptions) -> ImportResult:
    requests = [parse_line(obj, path, lineno) for lineno, obj in iter_jsonl(path, WHAT)]
    columns: dict[str, object] = {
        name: pa.array([getattr(r, name) for r in requests], type=pa.string())
        for name in ("api", "model", "prompt", "messages", "params", "session_id", "tenant")
    }
    columns["prompt_tokens"] = np.array([r.prompt_tokens for r in requests], dtype=np.int32)
    columns["output_tokens"] = np.array([r.output_tokens for r in requests], dtype=np.int32)
    estimated = sum(r.prompt_estimated for r in requests)
    first = requests[0].timestamp
    metadata = {
        META_CLOCK: first.isoformat() if isinstance(first, dt.datetime) else f"{first:g} s",
        META_REDACTION: "none",
    }
    if estimated:
        metadata[META_TOKENIZER] = ESTIMATED_TOKENIZER
    prefix = options.id_prefix or default_id_prefix("openai", path)
    trace, reordered = assemble(_seconds(requests, path), columns, prefix, metadata, path)
    chats = sum(r.api == "chat" for r in requests)
    notes = [f"{len(requests):,} requests with text ({chats:,} chat, {len(requests) - chats:,} completions)"]
    if estimated:
        notes.append(
            f"{estimated:,} prompt length(s) estimated at {BYTES_PER_TOKEN_ESTIMATE} bytes per token "
            "(no prompt_tokens or usage logged)"
        )
    return import_result(trace, reordered, notes)
