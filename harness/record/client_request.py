"""A completions or chat request as the client sent it, and the body the proxy sends upstream instead."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


def recorded_api(method: str, path: str) -> str | None:
    """'chat' / 'completions' for the generation routes that are recorded; None for every other route."""
    if method != "POST":
        return None
    path = path.rstrip("/")
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "completions"
    return None


@dataclass(frozen=True)
class ClientRequest:
    api: str
    body: dict[str, Any]
    raw: bytes

    @classmethod
    def parse(cls, api: str, raw: bytes) -> ClientRequest | None:
        """None when the body is not a JSON object (it is still forwarded, just not recorded)."""
        try:
            body = json.loads(raw)
        except ValueError:
            return None
        return cls(api, body, raw) if isinstance(body, dict) else None

    @property
    def streaming(self) -> bool:
        return self.body.get("stream") is True

    @property
    def needs_usage_injected(self) -> bool:
        """Streaming without `stream_options.include_usage`: the proxy asks for it, and strips it again."""
        options = self.body.get("stream_options")
        if not self.streaming or not (options is None or isinstance(options, dict)):
            return False
        return not (options or {}).get("include_usage")

    def upstream_body(self) -> bytes:
        """What goes upstream: the client's bytes, unless usage has to be asked for."""
        if not self.needs_usage_injected:
            return self.raw
        if "stream_options" not in self.body:  # insert the member after the opening brace: no re-serialising
            brace = self.raw.index(b"{") + 1
            return self.raw[:brace] + b'"stream_options":{"include_usage":true},' + self.raw[brace:]
        options = dict(self.body.get("stream_options") or {}) | {"include_usage": True}
        return json.dumps(self.body | {"stream_options": options}, ensure_ascii=False).encode()
