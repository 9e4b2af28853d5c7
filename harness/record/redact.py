"""What of a request body reaches the trace, per redaction mode.

- `none`: prompt / messages text and every other body field (as `params`), minus credentials.
- `hash`: no text at all: numeric and boolean params only, plus the prompt's token-block hashes.
- `drop`: numeric and boolean params only; token counts come from the upstream's `usage`.
Credentials (see `secrets`) are removed in every mode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from harness.record.secrets import is_secret_name, scrub, scrub_text
from harness.record.tokens import Tokenizer, prefix_block_ids

OWN_COLUMNS = ("prompt", "messages", "model")  # body fields with a trace column of their own, not in params


@dataclass(frozen=True)
class RedactedRequest:
    params: str
    prompt: str | None = None
    messages: str | None = None
    prefix_block_ids: list[int] | None = None
    prompt_token_count: int | None = None  # from our own tokenisation, used when the upstream sent no usage


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _prompt_text(prompt: Any) -> str:
    """A completions prompt as trace text: a string as is, a one-string list unwrapped, anything else as JSON."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    return scrub_text(prompt) if isinstance(prompt, str) else _dumps(scrub(prompt))


def numeric_params(body: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v
        for k, v in body.items()
        if k not in OWN_COLUMNS and isinstance(v, int | float | bool) and not is_secret_name(k)
    }


class Redactor:
    def __init__(self, mode: str, tokenizer: Tokenizer | None, block_size: int, key: bytes) -> None:
        self.mode = mode
        self._tokenizer = tokenizer
        self._block_size = block_size
        self._key = key

    async def redact(self, body: dict[str, Any]) -> RedactedRequest:
        if self.mode == "none":
            params = scrub({k: v for k, v in body.items() if k not in OWN_COLUMNS})
            return RedactedRequest(
                params=_dumps(params),
                prompt=_prompt_text(body["prompt"]) if "prompt" in body else None,
                messages=_dumps(scrub(body["messages"])) if "messages" in body else None,
            )
        params = _dumps(numeric_params(body))
        if self.mode == "drop" or self._tokenizer is None:
            return RedactedRequest(params=params)
        tokens = await self._tokenizer.tokens(body)
        if tokens is None:
            return RedactedRequest(params=params)
        return RedactedRequest(
            params=params,
            prefix_block_ids=prefix_block_ids(tokens, self._block_size, self._key),
            prompt_token_count=len(tokens),
        )
