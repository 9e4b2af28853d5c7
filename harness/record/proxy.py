"""The reverse proxy: every route is forwarded untouched; completions and chat are also handed to the capturer.

"Untouched" means method, raw path and query, end-to-end headers, body, status, reason and response bytes.
The only changes, both on recorded routes: the upstream is asked for an uncompressed response (so usage
can be read), and a streaming client that did not ask for usage gets it asked for and stripped again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from yarl import URL

from harness.record.capture import Capturer, Exchange
from harness.record.client_request import ClientRequest, recorded_api
from harness.record.headers import CLIENT_AUTO_HEADERS, end_to_end, upstream_request_headers
from harness.record.observe import BodyObserver, SseObserver
from harness.record.stats import RecorderStats

CLIENT_CLOSED_STATUS = 499  # recorded when the client went away before the response ended
Observer = SseObserver | BodyObserver


@dataclass(frozen=True)
class ProxySettings:
    upstream: URL
    max_body: int
    session_header: str
    tenant_header: str


async def read_capped(stream: aiohttp.StreamReader, cap: int) -> tuple[bytes, bool]:
    """Read the body up to just past `cap` bytes: (bytes read, whether that is the whole body)."""
    parts: list[bytes] = []
    size = 0
    while size <= cap:
        chunk = await stream.readany()
        if not chunk:
            return b"".join(parts), True
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts), False


async def _prefixed(prefix: bytes, rest: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The body as the client sends it: what was already read, then the rest as it arrives."""
    if prefix:
        yield prefix
    async for chunk in rest.iter_any():
        yield chunk


@dataclass
class _Relayed:
    """How one relay ended, for the record."""

    status: int = 0
    finished_at: float = 0.0
    client_gone: bool = False


class RecordingProxy:
    def __init__(
        self, settings: ProxySettings, session: aiohttp.ClientSession, capturer: Capturer, stats: RecorderStats
    ) -> None:
        self._settings = settings
        self._base = str(settings.upstream)
        self._session = session
        self._capturer = capturer
        self._stats = stats

    async def handle(self, request: web.Request) -> web.StreamResponse:
        arrived_at = time.monotonic()
        self._stats.requests += 1
        self._stats.in_flight += 1
        try:
            api = recorded_api(request.method, request.path)
            if api is None:
                body = _prefixed(b"", request.content) if request.body_exists else None
                return await self._relay(request, body, False, None, _Relayed())
            return await self._recorded(request, api, arrived_at)
        except asyncio.CancelledError:
            self._stats.unfinished += 1
            raise
        finally:
            self._stats.in_flight -= 1

    async def _recorded(self, request: web.Request, api: str, arrived_at: float) -> web.StreamResponse:
        raw, whole = await read_capped(request.content, self._settings.max_body)
        if not whole:
            self._stats.too_large += 1
            return await self._relay(request, _prefixed(raw, request.content), False, None, _Relayed())
        client_request = ClientRequest.parse(api, raw)
        if client_request is None:
            self._stats.not_json += 1
            return await self._relay(request, raw, True, None, _Relayed())
        observer: Observer = (
            SseObserver(strip_usage=client_request.needs_usage_injected)
            if client_request.streaming
            else BodyObserver(self._settings.max_body)
        )
        relayed = _Relayed()
        response = await self._relay(request, client_request.upstream_body(), True, observer, relayed)
        self._capturer.submit(
            Exchange(
                request=client_request,
                arrived_at=arrived_at,
                finished_at=relayed.finished_at,
                status=CLIENT_CLOSED_STATUS if relayed.client_gone else relayed.status,
                outcome=observer.outcome,
                session_id=request.headers.get(self._settings.session_header),
                tenant=request.headers.get(self._settings.tenant_header),
            )
        )
        return response

    async def _relay(
        self,
        request: web.Request,
        body: bytes | AsyncIterator[bytes] | None,
        replaced: bool,
        observer: Observer | None,
        relayed: _Relayed,
    ) -> web.StreamResponse:
        """Send the request upstream and stream the answer back through `observer` (None: untouched bytes)."""
        headers = upstream_request_headers(request.headers, body_replaced=replaced, identity=observer is not None)
        response: web.StreamResponse | None = None
        try:
            async with self._session.request(
                request.method,
                URL(self._base + request.raw_path, encoded=True),
                headers=headers,
                data=body,
                allow_redirects=False,
                skip_auto_headers=CLIENT_AUTO_HEADERS,
            ) as upstream:
                relayed.status = upstream.status
                edits = isinstance(observer, SseObserver) and upstream.content_type == "text/event-stream"
                response = web.StreamResponse(
                    status=upstream.status,
                    reason=upstream.reason,
                    headers=end_to_end(upstream.headers, ["Content-Length"] if edits else ()),
                )
                await response.prepare(request)
                await self._pump(upstream, response, observer, relayed)
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._stats.upstream_failures += 1
            relayed.finished_at = time.monotonic()
            if response is None:
                relayed.status = 502
                return _bad_gateway(exc)
            if request.transport is not None:  # the upstream broke mid-response: so does the client's response
                request.transport.close()
        return response

    async def _pump(
        self,
        upstream: aiohttp.ClientResponse,
        response: web.StreamResponse,
        observer: Observer | None,
        relayed: _Relayed,
    ) -> None:
        content = upstream.content
        closed = observer is None
        try:
            while chunk := await content.readany():  # not `async for ... iter_any()`: one coroutine less per chunk
                out = chunk if observer is None else observer.feed(chunk, time.monotonic())
                if out:
                    self._stats.bytes_to_clients += len(out)
                    await response.write(out)
            relayed.finished_at = time.monotonic()
            tail = observer.close(relayed.finished_at) if observer is not None else b""
            closed = True
            if tail:
                self._stats.bytes_to_clients += len(tail)
                await response.write(tail)
            await response.write_eof()
        except ConnectionResetError:
            relayed.finished_at = time.monotonic()
            relayed.client_gone = True
            self._stats.client_disconnects += 1
        finally:
            if not closed:  # the stream broke (either side): the events that did pass are still read and counted
                assert observer is not None
                observer.close(time.monotonic())


def _bad_gateway(exc: BaseException) -> web.Response:
    reason = type(exc).__name__ if not str(exc) else f"{type(exc).__name__}: {exc}"
    body = {
        "error": {
            "message": f"replaybench record: upstream unreachable ({reason})",
            "type": "upstream_unreachable",
            "code": 502,
        }
    }
    return web.Response(status=502, body=json.dumps(body).encode(), content_type="application/json")
