"""Prompt tokens for `--redact hash`, and the keyed hashes of fixed-size token blocks built from them.

Tokenisation: the upstream's own `POST /tokenize` (vLLM's endpoint; chat messages go through the server's
chat template) when it answers at start-up; otherwise the documented fallback `FALLBACK_TOKENIZER`:
whitespace-separated words of the prompt (for chat: each message's role, then the words of its text),
each word's CRC-32 as its id. The file metadata names the tokenizer used, so nobody mistakes one for the other.

Block ids: block i covers tokens [i*B, (i+1)*B) (full blocks only) and its id is a keyed BLAKE2b-64 of the
previous block's id and the block's tokens, so two prompts share the first k ids exactly when they share
their first k*B tokens. The key is random per recording and never stored, so nobody can confirm a guessed
text by hashing it; ids are only comparable within one recording.
"""

from __future__ import annotations

import hashlib
import zlib
from array import array
from typing import Any

import aiohttp
from yarl import URL

FALLBACK_TOKENIZER = "fallback: whitespace words, crc32 ids (upstream has no /tokenize)"
_PROBE_TIMEOUT = aiohttp.ClientTimeout(total=5)
_TOKENIZE_TIMEOUT = aiohttp.ClientTimeout(total=30)


def _content_text(content: Any) -> str:
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def fallback_tokens(body: dict[str, Any]) -> list[int]:
    """The documented fallback tokenisation of a completions or chat request body."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return list(prompt)  # already token ids
    if "messages" in body and isinstance(body["messages"], list):
        words = [
            w
            for m in body["messages"]
            if isinstance(m, dict)
            for w in [str(m.get("role", "")), *_content_text(m.get("content")).split()]
        ]
    else:
        words = (" ".join(map(str, prompt)) if isinstance(prompt, list) else str(prompt or "")).split()
    return [zlib.crc32(word.encode()) for word in words]


class Tokenizer:
    """Tokenises request bodies with the upstream's `/tokenize`, or with the fallback when it has none."""

    def __init__(self, session: aiohttp.ClientSession, upstream: URL, use_upstream: bool) -> None:
        self._session = session
        self._url = upstream / "tokenize"
        self.upstream = use_upstream
        self.name = f"upstream {self._url} (the served model's tokenizer)" if use_upstream else FALLBACK_TOKENIZER

    @classmethod
    async def probe(cls, session: aiohttp.ClientSession, upstream: URL) -> Tokenizer:
        """Use the upstream's `/tokenize` if it tokenises a probe prompt now; otherwise the fallback."""
        try:
            async with session.post(
                upstream / "tokenize", json={"prompt": "hello world"}, timeout=_PROBE_TIMEOUT
            ) as response:
                works = response.status == 200 and isinstance((await response.json()).get("tokens"), list)
        except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
            works = False
        return cls(session, upstream, works)

    async def tokens(self, body: dict[str, Any]) -> list[int] | None:
        """Token ids of the request's prompt; None if the upstream could not tokenise it."""
        if not self.upstream:
            return fallback_tokens(body)
        query = {k: body[k] for k in ("model", "prompt", "messages") if k in body}
        try:
            async with self._session.post(self._url, json=query, timeout=_TOKENIZE_TIMEOUT) as response:
                tokens = (await response.json()).get("tokens") if response.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
            return None
        return tokens if isinstance(tokens, list) else None


def prefix_block_ids(tokens: list[int], block_size: int, key: bytes) -> list[int]:
    """Chained keyed hashes of the full `block_size`-token blocks of `tokens` (see module docstring)."""
    ids: list[int] = []
    previous = b""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = array("q", tokens[start : start + block_size]).tobytes()
        previous = hashlib.blake2b(previous + block, digest_size=8, key=key).digest()
        ids.append(int.from_bytes(previous, "little", signed=True))
    return ids
