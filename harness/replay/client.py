"""Send one prepared request and record what its customer saw: status, error class, TTFT, chunk times, E2E.

Error classes (RESULT_SCHEMA `error`): connect (no connection), timeout (no byte for `read_timeout_s`, or
the whole request over `request_timeout_s`), http_429 / http_4xx / http_5xx (status), broken_stream (the
server closed or corrupted the response, or the stream ended without `[DONE]`), client_queue (a
`--max-inflight` slot did not free up within `queue_timeout_s`). Whatever arrived before a failure
(chunk times, counts) is kept.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from urllib.parse import quote

import aiohttp

from harness.replay.payloads import PreparedRequest
from harness.replay.result_row import ResultRow
from harness.replay.stream_parse import StreamReader, read_whole


@dataclass(frozen=True)
class ClientSettings:
    """What every request of a worker shares."""

    url: str
    arm: str
    repeat: int
    worker: int
    t0: float  # time.monotonic() of trace time 0
    stream: bool
    keep_text: bool
    headers: dict[str, str]
    timeout: aiohttp.ClientTimeout
    request_id_prefix: str  # see `request_id_prefix`


def request_id_prefix(arm: str, repeat: int) -> str:
    """The start of every `X-Request-Id` this run sends: arm, repeat and a random run tag.

    Why: a slow or failed request in the report can then be found in the server's own log (vLLM takes the header
    as its request id: `cmpl-<id>` in its log lines and, with `--enable-request-id-headers`, in the response); the
    tag keeps ids unique when the same trace is replayed again against a server that is still up.
    """
    return f"rb-{quote(arm, safe='')}-r{repeat}-{secrets.token_hex(4)}-"


def request_id_header(settings: ClientSettings, request_id: str) -> str:
    """The request's `X-Request-Id`: the run's prefix and its trace id, percent-quoted so any id is a valid header."""
    return settings.request_id_prefix + quote(request_id, safe="-._~:")


def status_error(status: int) -> str | None:
    """Error class of an HTTP status (200 is success; any other non-5xx status counts as a client error)."""
    if status == 200:
        return None
    if status == 429:
        return "http_429"
    return "http_5xx" if status >= 500 else "http_4xx"


def new_row(request: PreparedRequest, settings: ClientSettings) -> ResultRow:
    return ResultRow(
        request_id=request.request_id,
        arm=settings.arm,
        repeat=settings.repeat,
        intended_s=request.intended_s,
        worker=settings.worker,
        prompt_tokens=request.prompt_tokens,
        expected_output_tokens=request.expected_output_tokens,
        tenant=request.tenant,
    )


async def send(session: aiohttp.ClientSession, request: PreparedRequest, settings: ClientSettings) -> ResultRow:
    """Send now; return the finished row (never raises for server or network trouble)."""
    row = new_row(request, settings)
    sent = time.monotonic()
    row.sent_s = sent - settings.t0
    row.lag_s = row.sent_s - request.intended_s
    reader = StreamReader(row, settings.keep_text) if settings.stream else None
    try:
        async with session.post(
            settings.url + request.path,
            data=request.body,
            headers=settings.headers | {"X-Request-Id": request_id_header(settings, request.request_id)},
            timeout=settings.timeout,
        ) as response:
            row.status = response.status
            if response.status != 200:
                await response.read()
                row.error = status_error(response.status)
            elif reader is not None:
                async for data in response.content.iter_any():
                    reader.feed_bytes(data, time.monotonic() - sent)
                reader.feed_bytes(b"\n", time.monotonic() - sent)  # completes a last line sent without newline
                if not reader.done or reader.server_error:
                    row.error = "broken_stream"
            else:
                read_whole(row, await response.read(), settings.keep_text)
    except TimeoutError:
        row.error = "timeout"
    except aiohttp.ClientConnectorError:
        row.error = "connect"
    except (aiohttp.ClientError, ValueError):  # payload errors, disconnects, resets, undecodable JSON
        row.error = "broken_stream"
    row.e2e_s = time.monotonic() - sent
    if reader is not None:
        reader.finish()
    return row


def queue_timeout_row(request: PreparedRequest, settings: ClientSettings) -> ResultRow:
    """A request that never left the client because the --max-inflight cap stayed full."""
    row = new_row(request, settings)
    row.error = "client_queue"
    return row
