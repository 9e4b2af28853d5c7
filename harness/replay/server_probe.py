"""What the target server offers before the clock starts: its model names and whether it has `/tokenize`."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp

from harness.errors import UserError


@dataclass(frozen=True)
class ServerInfo:
    models: tuple[str, ...]  # ids from /v1/models (empty when the server has no such endpoint)
    tokenize: bool  # POST /tokenize answers with a token count


async def probe_server(session: aiohttp.ClientSession, url: str) -> ServerInfo:
    """Ask /v1/models and /tokenize; a server that cannot be reached at all is a one-line `UserError`."""
    try:
        async with session.get(f"{url}/v1/models") as response:
            data = await response.json(content_type=None) if response.status == 200 else {}
    except (aiohttp.ClientConnectionError, TimeoutError) as exc:
        raise UserError(
            f"cannot reach the server at {url} ({type(exc).__name__}: {exc}); start it or fix --url"
        ) from None
    except (aiohttp.ContentTypeError, ValueError):
        data = {}
    models = tuple(str(m["id"]) for m in data.get("data", []) if isinstance(m, dict) and "id" in m)
    body = {"prompt": "hello world"} | ({"model": models[0]} if models else {})
    try:
        async with session.post(f"{url}/tokenize", json=body) as response:
            answer = await response.json(content_type=None) if response.status == 200 else {}
    except (aiohttp.ClientError, TimeoutError, ValueError):
        answer = {}
    return ServerInfo(models=models, tokenize=isinstance(answer, dict) and ("count" in answer or "tokens" in answer))
