"""Server-sent events at the byte level: find whole events, read their JSON data, delete one JSON key exactly.

Deleting a key edits the raw bytes (never re-serialises), so everything else the client sees stays
byte-for-byte what the upstream sent.
"""

from __future__ import annotations

import json
from typing import Any

_WHITESPACE = b" \t\r\n"
_DECODER = json.JSONDecoder()


def complete_prefix_end(data: bytes) -> int:
    """Length of the longest prefix of `data` made of whole events (0 if no event is complete yet)."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)


def events(data: bytes) -> list[bytes]:
    """The whole events in `data`, each with its terminator (a blank line: LF or CRLF line ends); any unterminated
    rest is left out. A find() loop: an event is nearly always one line, and a regex costs ten times more here."""
    found: list[bytes] = []
    start = pos = 0
    while (newline := data.find(b"\n", pos)) >= 0:
        if data[newline + 1 : newline + 2] == b"\n":
            end = newline + 2
        elif data[newline + 1 : newline + 3] == b"\r\n":
            end = newline + 3
        else:
            pos = newline + 1
            continue
        found.append(data[start:end])
        start = pos = end
    return found


def data_payload(event: bytes) -> bytes | None:
    """The event's `data:` field (lines joined by newlines), or None if it has none."""
    if event.startswith(b"data: "):  # the usual one-line event, without splitting it into lines
        payload = event[6:].rstrip(_WHITESPACE)
        if b"\n" not in payload:
            return payload
    parts = [
        line[5:].removeprefix(b" ") for line in event.rstrip(_WHITESPACE).split(b"\n") if line.startswith(b"data:")
    ]
    if not parts:
        return None
    return b"\n".join(part.rstrip(b"\r") for part in parts)


def json_payload(event: bytes) -> dict[str, Any] | None:
    payload = data_payload(event)
    if payload is None or payload == b"[DONE]":
        return None
    try:
        value = json.loads(payload.decode())  # a str skips json's encoding detection for bytes
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def without_key(raw: bytes, parsed: dict[str, Any], key: str) -> bytes | None:
    """`raw` (the JSON text of `parsed`) with the top-level `key` and its value cut out, every other byte kept;
    None if no occurrence of the key can be cut so that the rest parses to `parsed` minus `key`."""
    wanted = {k: v for k, v in parsed.items() if k != key}
    text = raw.decode()
    quoted = json.dumps(key)
    start = text.rfind(quoted)
    while start >= 0:
        candidate = _cut_member(text, start, len(quoted))
        if candidate is not None:
            try:
                if json.loads(candidate) == wanted:
                    return candidate.encode()
            except ValueError:
                pass
        start = text.rfind(quoted, 0, start)
    return None


def _cut_member(text: str, start: int, key_len: int) -> str | None:
    """Remove the object member whose key starts at `start`, with the comma that joins it to a neighbour."""
    colon = _skip_ws(text, start + key_len)
    if colon >= len(text) or text[colon] != ":":
        return None
    try:
        _, end = _DECODER.raw_decode(text, _skip_ws(text, colon + 1))
    except ValueError:
        return None
    before = text[:start].rstrip(" \t\r\n")
    after_pos = _skip_ws(text, end)
    if before.endswith(","):  # `..., "key": v` -> `...`
        return before[:-1] + text[end:]
    if after_pos < len(text) and text[after_pos] == ",":  # `{"key": v, ...` -> `{...`
        return text[:start] + text[_skip_ws(text, after_pos + 1) :]
    return text[:start] + text[end:]


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos
