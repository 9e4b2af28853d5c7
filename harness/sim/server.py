"""The simulated engine's OpenAI-compatible HTTP server (aiohttp): generation, models, health, tokenize, metrics.

Every response is computed by `RealtimeEngine`; nothing here decides timing. Logs, `/v1/models` and
`/metrics` all say the server is SIMULATED.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from harness.sim.engine_core import RequestRejected
from harness.sim.faults import FaultInjector
from harness.sim.generation import OutputPlan, plan_output
from harness.sim.metrics import EngineMetrics
from harness.sim.openai_payloads import (
    CHAT,
    COMPLETIONS,
    DONE,
    BadRequest,
    GenerationRequest,
    ResponseFormatter,
    error_body,
    parse_generation,
)
from harness.sim.realtime import RealtimeEngine, TokenTick
from harness.sim.scheduler import Sequence
from harness.sim.tokenizer import chat_prompt_text, encode, token_text

OWNED_BY = "replaybench-sim (simulated)"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass
class ServerState:
    engine: RealtimeEngine
    metrics: EngineMetrics
    faults: FaultInjector
    model_name: str
    seed: int
    ids: itertools.count[int]

    @property
    def max_model_len(self) -> int:
        return self.engine.core.spec.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.engine.core.spec.shape.vocab_size


STATE = web.AppKey("state", ServerState)


def _error(message: str, status: int) -> web.Response:
    return web.json_response(error_body(message, status), status=status)


@web.middleware
async def _startup_gate(request: web.Request, handler: Any) -> web.StreamResponse:
    """--startup-delay: answer 503 everywhere until the simulated start-up is over."""
    if not request.app[STATE].faults.ready():
        return _error("the simulated engine is still starting (--startup-delay)", 503)
    return await handler(request)


async def health(_: web.Request) -> web.Response:
    return web.Response()


async def models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    entry = {
        "id": state.model_name,
        "object": "model",
        "created": 0,
        "owned_by": OWNED_BY,
        "root": state.model_name,
        "max_model_len": state.max_model_len,
        "simulated": True,
    }
    return web.json_response({"object": "list", "data": [entry]})


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    core = state.engine.core
    text = state.metrics.render(
        running=len(core.scheduler.running),
        waiting=len(core.scheduler.waiting),
        memory_usage=core.pool.usage,
        preemptions=core.scheduler.preemptions,
    )
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def tokenize(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        body = await request.json()
        text = chat_prompt_text(body["messages"]) if "messages" in body else body["prompt"]
        if not isinstance(text, str):
            raise ValueError("'prompt' must be a string")
    except (ValueError, KeyError, TypeError) as exc:
        return _error(f"send {{'prompt': TEXT}} or {{'messages': [...]}} ({exc})", 400)
    tokens = encode(text, state.vocab_size)
    return web.json_response(
        {"count": len(tokens), "max_model_len": state.max_model_len, "tokens": tokens, "token_strs": None}
    )


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, COMPLETIONS)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, CHAT)


async def _generate(request: web.Request, api: str) -> web.StreamResponse:
    state = request.app[STATE]
    state.faults.admit_request()
    try:
        parsed = parse_generation(await request.json(), api, state.max_model_len)
    except ValueError as exc:  # includes JSON decode errors and BadRequest
        state.metrics.requests_rejected += 1
        return _error(str(exc) if isinstance(exc, BadRequest) else f"the body is not valid JSON ({exc})", 400)
    if state.faults.should_fail():
        state.metrics.injected_failures += 1
        return _error("injected failure (--fail-rate)", 500)
    plan = plan_output(
        state.seed,
        parsed.seed,
        parsed.prompt_text,
        parsed.max_tokens,
        parsed.min_tokens,
        parsed.ignore_eos,
        state.vocab_size,
    )
    # As vLLM: the client's X-Request-Id names the request (`cmpl-<id>`); the engine's own id stays unique
    number = next(state.ids)
    named = request.headers.get("X-Request-Id") or f"sim{number}"
    request_id = f"{'cmpl' if api == COMPLETIONS else 'chatcmpl'}-{named}"
    try:
        seq, queue = state.engine.submit(f"{request_id}#{number}", parsed.prompt_tokens, plan.length)
    except RequestRejected as exc:
        state.metrics.requests_rejected += 1
        return _error(str(exc), 400)
    formatter = ResponseFormatter(api, request_id, state.model_name)
    try:
        if parsed.stream:
            return await _stream(request, state, parsed, plan, seq, queue, formatter)
        return await _collect(request, state, parsed, plan, seq, queue, formatter)
    finally:
        state.engine.abort(seq)


async def _stream(
    request: web.Request,
    state: ServerState,
    parsed: GenerationRequest,
    plan: OutputPlan,
    seq: Sequence,
    queue: asyncio.Queue[TokenTick],
    formatter: ResponseFormatter,
) -> web.StreamResponse:
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    try:
        opening = formatter.role_chunk()
        if opening:
            await response.write(opening)
        sent = 0
        while sent < plan.length:
            if state.faults.stalls_at(sent):
                await _stall(request, state, seq)
                return response
            produced, deadline = await queue.get()
            # one SSE chunk per engine step, as vLLM streams: several tokens in it under speculative decoding
            text = "".join(token_text(plan.token_id(i), first=i == 0) for i in range(sent, produced))
            sent = produced
            chunk = formatter.token_chunk(text, plan.finish_reason if sent == plan.length else None)
            if parsed.continuous_usage:
                chunk = formatter.with_usage(chunk, parsed.prompt_tokens, sent)
            await response.write(chunk)
            state.metrics.delivery.observe(time.monotonic() - deadline)
        if parsed.include_usage:
            await response.write(formatter.usage_chunk(parsed.prompt_tokens, sent))
        await response.write(DONE)
        await response.write_eof()
    except (ConnectionResetError, ConnectionError):
        pass  # the client left; `_generate` aborts the sequence
    return response


async def _collect(
    request: web.Request,
    state: ServerState,
    parsed: GenerationRequest,
    plan: OutputPlan,
    seq: Sequence,
    queue: asyncio.Queue[TokenTick],
    formatter: ResponseFormatter,
) -> web.StreamResponse:
    produced = 0
    while produced < plan.length:
        if state.faults.stalls_at(produced):
            await _stall(request, state, seq)
            return web.Response(status=499)
        produced = (await queue.get()).produced
    text = "".join(token_text(plan.token_id(i), first=i == 0) for i in range(plan.length))
    return web.json_response(formatter.full_response(text, plan.finish_reason, parsed.prompt_tokens, plan.length))


async def _stall(request: web.Request, state: ServerState, seq: Sequence) -> None:
    """--stall-after-tokens: stop producing, keep the connection open until the client gives up."""
    state.metrics.injected_stalls += 1
    state.engine.abort(seq)
    while request.transport is not None and not request.transport.is_closing():
        await asyncio.sleep(0.2)


def build_app(state: ServerState) -> web.Application:
    app = web.Application(middlewares=[_startup_gate])
    app[STATE] = state
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    return app
