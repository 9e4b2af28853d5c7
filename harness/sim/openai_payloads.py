"""Parse OpenAI-style generation requests and build the JSON bodies / SSE chunks the server sends back."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

from harness.sim.engine_core import context_length_message
from harness.sim.tokenizer import chat_prompt_text, count_tokens

COMPLETIONS, CHAT = "completions", "chat"


class BadRequest(ValueError):
    """The request body is invalid; answered with HTTP 400 and this message."""


@dataclass(frozen=True)
class GenerationRequest:
    api: str
    prompt_text: str
    prompt_tokens: int
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool  # stream_options.continuous_usage_stats: cumulative usage in every token chunk
    seed: int | None


def _int_field(body: dict[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f"'{name}' must be a non-negative integer (got {value!r})")
    return value


def _completion_prompt(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return " ".join(f"t{t}" for t in prompt)
    raise BadRequest("'prompt' must be a string or a list of token ids (one prompt per request)")


def parse_generation(body: Any, api: str, max_model_len: int) -> GenerationRequest:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if body.get("n", 1) != 1:
        raise BadRequest("the simulated engine supports only n=1")
    try:
        text = _completion_prompt(body.get("prompt")) if api == COMPLETIONS else chat_prompt_text(body.get("messages"))
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    prompt_tokens = count_tokens(text)
    name = "max_completion_tokens" if api == CHAT and "max_completion_tokens" in body else "max_tokens"
    max_tokens = _int_field(body, name, None)
    if max_tokens is None:
        max_tokens = max(max_model_len - prompt_tokens, 1)
    if max_tokens < 1:
        raise BadRequest(f"'{name}' must be at least 1")
    if prompt_tokens + max_tokens > max_model_len:
        raise BadRequest(context_length_message(max_model_len, prompt_tokens, max_tokens))
    min_tokens = _int_field(body, "min_tokens", 0) or 0
    if min_tokens > max_tokens:
        raise BadRequest(f"min_tokens ({min_tokens}) must be <= {name} ({max_tokens})")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest(f"'seed' must be an integer (got {seed!r})")
    options = body.get("stream_options") or {}
    return GenerationRequest(
        api=api,
        prompt_text=text,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=bool(body.get("ignore_eos", False)),
        stream=bool(body.get("stream", False)),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        continuous_usage=bool(isinstance(options, dict) and options.get("continuous_usage_stats")),
        seed=seed,
    )


def error_body(message: str, status: int) -> dict[str, Any]:
    kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}.get(
        status, "InternalServerError"
    )
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


_TEXT_SLOT, _FINISH_SLOT = "\x00text\x00", "\x00finish\x00"


class ResponseFormatter:
    """Builds the bodies of one response, in the shape of the API it answers (completions or chat).

    Token chunks are the hot path (one per token per stream), so their JSON is rendered once with two slots
    and later filled by byte concatenation instead of a `json.dumps` per token.
    """

    def __init__(self, api: str, request_id: str, model: str) -> None:
        self.api, self.id, self.model, self.created = api, request_id, model, int(time.time())
        self._chunk_object = "text_completion" if api == COMPLETIONS else "chat.completion.chunk"
        choice = self._choice(_TEXT_SLOT, _FINISH_SLOT, delta=True)
        if api == CHAT:
            choice["delta"] = {"content": _TEXT_SLOT}
        template = sse(self._envelope(self._chunk_object, [choice]))
        head, rest = template.split(json.dumps(_TEXT_SLOT).encode())
        middle, tail = rest.split(json.dumps(_FINISH_SLOT).encode())
        self._parts = (head, middle, tail)

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def _choice(self, text: str, finish: str | None, delta: bool) -> dict[str, Any]:
        if self.api == COMPLETIONS:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        key = "delta" if delta else "message"
        return {"index": 0, key: {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish}

    def role_chunk(self) -> bytes | None:
        """Chat streams open with an empty assistant delta, as vLLM's do; completions have none."""
        if self.api == COMPLETIONS:
            return None
        return sse(self._envelope(self._chunk_object, [self._choice("", None, delta=True)]))

    def token_chunk(self, text: str, finish: str | None) -> bytes:
        head, middle, tail = self._parts
        finish_json = b"null" if finish is None else encode_basestring_ascii(finish).encode()
        return b"".join((head, encode_basestring_ascii(text).encode(), middle, finish_json, tail))

    @staticmethod
    def with_usage(chunk: bytes, prompt_tokens: int, completion_tokens: int) -> bytes:
        """A token chunk carrying cumulative usage, as vLLM's continuous_usage_stats streams do."""
        member = json.dumps(usage(prompt_tokens, completion_tokens), separators=(",", ":")).encode()
        return chunk[: -len(_CHUNK_END)] + b',"usage":' + member + _CHUNK_END

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        return sse(self._envelope(self._chunk_object, []) | {"usage": usage(prompt_tokens, completion_tokens)})

    def full_response(self, text: str, finish: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        obj = "text_completion" if self.api == COMPLETIONS else "chat.completion"
        return self._envelope(obj, [self._choice(text, finish, delta=False)]) | {
            "usage": usage(prompt_tokens, completion_tokens)
        }


DONE = b"data: [DONE]\n\n"
_CHUNK_END = b"}\n\n"  # the envelope's closing brace and the SSE event's end


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
