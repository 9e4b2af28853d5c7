"""Client-side helpers for the record tests: raw HTTP via aiohttp, and request bodies with unique prompts."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

import aiohttp

_CREATED = re.compile(rb'"created": \d+')


def without_created(raw: bytes) -> bytes:
    """The test upstream stamps `created` with the current second; nothing else in its output varies."""
    return _CREATED.sub(b'"created": 0', raw)


@dataclass(frozen=True)
class RawResponse:
    status: int
    content_type: str
    body: bytes


async def fetch(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> RawResponse:
    async with session.request(method, url, data=body, headers=headers) as response:
        return RawResponse(response.status, response.headers.get("Content-Type", ""), await response.read())


def fetch_all(
    requests: list[tuple[str, str, bytes | None]], base_url: str, headers: dict[str, str] | None = None
) -> list[RawResponse]:
    """Send (method, path, body) requests one after another; the raw answers, in order."""

    async def run() -> list[RawResponse]:
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            return [await fetch(session, method, base_url + path, body, headers) for method, path, body in requests]

    return asyncio.run(run())


def chat_body(text: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": "test-model", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens} | extra


def completion_body(text: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": "test-model", "prompt": text, "max_tokens": max_tokens} | extra


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def chat_prompt_tokens(text: str) -> int:
    """The test upstream's count: words plus a role and an end marker per message."""
    return len(text.split()) + 2
