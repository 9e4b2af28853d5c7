"""Build every request body before the clock starts: prompt (recorded or synthesised), forced output length.

Bodies are canonical JSON bytes that depend only on (trace row, seed, model, api, server tokenizer), so two
arms serving the same model get byte-identical requests. Output length is forced to the trace's:
`max_tokens = min_tokens = output_tokens`, `ignore_eos: true`; recorded stop strings are dropped (they would
end generation early) and only sampling parameters are kept from the recorded `params`. Rows recorded with
0 prompt or output tokens (requests that failed in production) are sent with at least one word and one
output token, because servers reject empty prompts and `max_tokens = 0`; their load is kept.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from harness.records.trace_schema import META_BLOCK_SIZE
from harness.replay.options import ReplayOptions
from harness.replay.prompts import prompt_words
from harness.replay.server_probe import ServerInfo
from harness.replay.token_fit import Calibration, ServerTokenizer, calibrate, fit_word_count
from harness.trace.model import Trace

API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
SAMPLING_PARAMS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
DEFAULT_BLOCK_SIZE = 512  # tokens per prefix block when the trace does not say (the Mooncake convention)
TOKENIZE_CONCURRENCY = 16
FALLBACK_MODEL = "default"


@dataclass(frozen=True)
class PreparedRequest:
    """One request ready to send: where, what bytes, and what the trace expects back."""

    index: int
    request_id: str
    intended_s: float  # seconds after t0
    path: str
    body: bytes
    prompt_tokens: int  # the trace's prompt length
    expected_output_tokens: int
    tenant: str | None = None  # the trace's tenant, carried to the result row


def canonical_json(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def recorded_content(api: str, prompt: str | None, messages: str | None) -> dict[str, Any]:
    """The recorded prompt in the shape `api` needs (a chat row sent as completions joins its contents)."""
    if api == "chat":
        return {"messages": json.loads(messages) if messages else [{"role": "user", "content": prompt}]}
    if prompt is not None:
        return {"prompt": prompt}
    return {"prompt": "\n\n".join(str(m.get("content") or "") for m in json.loads(messages or "[]"))}


def synthetic_content(api: str, words: list[str]) -> dict[str, Any]:
    text = " ".join(words)
    return {"messages": [{"role": "user", "content": text}]} if api == "chat" else {"prompt": text}


def sampling_params(params: str | None) -> dict[str, Any]:
    try:
        recorded = json.loads(params) if params else {}
    except ValueError:
        return {}
    return {k: recorded[k] for k in SAMPLING_PARAMS if isinstance(recorded, dict) and k in recorded}


def choose_model(requested: str | None, row_model: str | None, served: tuple[str, ...]) -> str:
    """--model, else the trace's model if the server serves it, else the server's first model."""
    if requested:
        return requested
    if row_model and (not served or row_model in served):
        return row_model
    return served[0] if served else (row_model or FALLBACK_MODEL)


def generation_body(
    model: str,
    content: dict[str, Any],
    params: dict[str, Any],
    output_tokens: int,
    stream: bool,
    usage_per_chunk: bool = True,
) -> bytes:
    """The request body; a stream asks for usage (per chunk too, so tokens are counted by the server)."""
    body: dict[str, Any] = {"model": model} | content | params
    body |= {"max_tokens": output_tokens, "min_tokens": output_tokens, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True} | ({"continuous_usage_stats": True} if usage_per_chunk else {})
    return canonical_json(body)


class PromptSynthesizer:
    """Synthesises prompt content of a target token length, against /tokenize when the server has it.

    Fallback without /tokenize: one vocabulary word per token (chat: the words go in one user message).
    """

    def __init__(self, seed: int, block_size: int, tokenizer: ServerTokenizer | None) -> None:
        self.seed = seed
        self.block_size = block_size
        self.tokenizer = tokenizer
        self._calibrations: dict[str, asyncio.Task[Calibration]] = {}

    async def content(self, api: str, request_id: str, block_ids: list[int], prompt_tokens: int) -> dict[str, Any]:
        def build(n: int) -> dict[str, Any]:
            return synthetic_content(api, prompt_words(self.seed, request_id, block_ids, self.block_size, n))

        if self.tokenizer is None:
            return build(max(1, prompt_tokens))
        tokenizer = self.tokenizer

        async def count(n: int) -> int:
            return await tokenizer.count(build(n))

        if api not in self._calibrations:
            self._calibrations[api] = asyncio.ensure_future(
                calibrate(
                    lambda n: tokenizer.count(synthetic_content(api, prompt_words(self.seed, "calibration", [], 1, n)))
                )
            )
        calibration = await self._calibrations[api]
        return build(await fit_word_count(count, prompt_tokens, calibration))


async def prepare_requests(
    trace: Trace, url: str, options: ReplayOptions, server: ServerInfo, session: aiohttp.ClientSession
) -> list[PreparedRequest]:
    """Every request body of the (already time-scaled) trace, in arrival order."""
    cols = {
        name: trace.table.column(name).to_pylist()
        for name in (
            "request_id",
            "arrival_s",
            "api",
            "model",
            "prompt",
            "messages",
            "prompt_tokens",
            "prefix_block_ids",
            "output_tokens",
            "params",
            "tenant",
        )
    }
    block_size = int(trace.metadata.get(META_BLOCK_SIZE) or DEFAULT_BLOCK_SIZE)
    synthesizers: dict[str, PromptSynthesizer] = {}
    limit = asyncio.Semaphore(TOKENIZE_CONCURRENCY)

    async def prepare(i: int) -> PreparedRequest:
        api = options.api or cols["api"][i]
        model = choose_model(options.model, cols["model"][i], server.models)
        if cols["prompt"][i] is not None or cols["messages"][i] is not None:
            content = recorded_content(api, cols["prompt"][i], cols["messages"][i])
        else:
            if model not in synthesizers:
                tokenizer = ServerTokenizer(session, url, model) if server.tokenize else None
                synthesizers[model] = PromptSynthesizer(options.seed, block_size, tokenizer)
            async with limit:
                content = await synthesizers[model].content(
                    api, cols["request_id"][i], cols["prefix_block_ids"][i] or [], cols["prompt_tokens"][i]
                )
        output_tokens = max(1, cols["output_tokens"][i])
        params = sampling_params(cols["params"][i])
        body = generation_body(model, content, params, output_tokens, options.stream, options.usage_per_chunk)
        return PreparedRequest(
            index=i,
            request_id=cols["request_id"][i],
            intended_s=cols["arrival_s"][i],
            path=API_PATHS[api],
            body=body,
            prompt_tokens=cols["prompt_tokens"][i],
            expected_output_tokens=output_tokens,
            tenant=cols["tenant"][i],
        )

    return list(await asyncio.gather(*(prepare(i) for i in range(trace.table.num_rows))))
