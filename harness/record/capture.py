"""Turn one finished exchange into a trace row, off the request path (hash mode may call `/tokenize`)."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

from harness.record.client_request import ClientRequest
from harness.record.observe import ResponseOutcome
from harness.record.recording import Recording
from harness.record.redact import Redactor
from harness.record.row import RecordedRow
from harness.record.secrets import scrub_text


@dataclass(frozen=True)
class Exchange:
    """A recorded request as the proxy saw it; times are time.monotonic()."""

    request: ClientRequest
    arrived_at: float
    finished_at: float
    status: int
    outcome: ResponseOutcome
    session_id: str | None  # header values as sent: scrubbed when the row is built, off the request path
    tenant: str | None


class Capturer:
    def __init__(self, run_id: str, started_at: float, redactor: Redactor, recording: Recording) -> None:
        self._run_id = run_id
        self._started_at = started_at
        self._redactor = redactor
        self._recording = recording
        self._seq = itertools.count(1)
        self._pending: set[asyncio.Task[None]] = set()

    def submit(self, exchange: Exchange) -> None:
        """Record in the background; the request id is assigned now, in finishing order."""
        request_id = f"{self._run_id}-{next(self._seq):08d}"
        task = asyncio.get_running_loop().create_task(self._record(request_id, exchange))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def drain(self) -> None:
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def _record(self, request_id: str, exchange: Exchange) -> None:
        self._recording.append(await self._row(request_id, exchange))

    async def _row(self, request_id: str, exchange: Exchange) -> RecordedRow:
        body, outcome = exchange.request.body, exchange.outcome
        redacted = await self._redactor.redact(body)
        streamed = exchange.request.streaming
        output_tokens = outcome.completion_tokens
        if output_tokens is None:
            output_tokens = outcome.token_chunks if streamed else 0
        ttft = outcome.first_token_at - exchange.arrived_at if streamed and outcome.first_token_at else None
        model = body.get("model")
        return RecordedRow(
            request_id=request_id,
            arrival_s=exchange.arrived_at - self._started_at,
            api=exchange.request.api,
            prompt_tokens=outcome.prompt_tokens
            if outcome.prompt_tokens is not None
            else (redacted.prompt_token_count or 0),
            output_tokens=output_tokens,
            params=redacted.params,
            session_id=_scrubbed(exchange.session_id),
            model=scrub_text(model) if isinstance(model, str) else None,
            prompt=redacted.prompt,
            messages=redacted.messages,
            prefix_block_ids=redacted.prefix_block_ids,
            tenant=_scrubbed(exchange.tenant),
            status=exchange.status,
            ttft_s=ttft,
            e2e_s=exchange.finished_at - exchange.arrived_at,
            finish_reason=outcome.finish_reason,
        )


def _scrubbed(header_value: str | None) -> str | None:
    return scrub_text(header_value) if header_value else None
