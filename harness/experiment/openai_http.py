"""The few blocking OpenAI-API calls the experiment makes outside the replay: warm-up, quality tasks, agreement.

Greedy (temperature 0), non-streaming, one at a time (the agreement check sends its batch from threads): these
requests are never measured.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from harness.errors import UserError


def _post(url: str, body: dict[str, object], timeout_s: float) -> dict[str, object]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:200]
        raise UserError(f"{url} answered HTTP {error.code} ({detail}); check the arm's model and api") from None
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise UserError(f"{url} did not answer ({error}); is the server still running?") from None


def first_model(base_url: str, timeout_s: float = 10.0) -> str:
    """The first model id the server lists (what to request when the arm names no model)."""
    url = base_url.rstrip("/") + "/v1/models"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return str(json.loads(response.read())["data"][0]["id"])
    except urllib.error.HTTPError as error:  # a server answered, without a model list
        raise UserError(f"{url} lists no model (HTTP {error.code}); set the arm's `model`") from None
    except (urllib.error.URLError, OSError) as error:  # nothing answered: a model name would not help
        raise UserError(f"{url} did not answer ({error}); start the server or fix the URL") from None
    except (ValueError, KeyError, IndexError) as error:
        raise UserError(f"{url} lists no model ({type(error).__name__}: {error}); set the arm's `model`") from None


def generate(base_url: str, model: str, api: str, prompt: str, max_tokens: int, timeout_s: float = 300.0) -> str:
    """Greedy completion text for `prompt` (chat: one user message)."""
    base = base_url.rstrip("/")
    common = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": False}
    if api == "chat":
        body = _post(
            f"{base}/v1/chat/completions", common | {"messages": [{"role": "user", "content": prompt}]}, timeout_s
        )
        return str(body["choices"][0]["message"]["content"] or "")  # type: ignore[index]
    body = _post(f"{base}/v1/completions", common | {"prompt": prompt}, timeout_s)
    return str(body["choices"][0]["text"] or "")  # type: ignore[index]


@dataclass(frozen=True)
class Answer:
    """One greedy completion: its text, its token ids (None when the server does not return them) and the
    number of tokens the server says it generated."""

    text: str
    token_ids: list[int] | None
    completion_tokens: int | None


def exact_completion_body(model: str, prompt: str | list[int], tokens: int) -> dict[str, Any]:
    """A greedy /v1/completions body for exactly `tokens` tokens (ignore_eos, min_tokens = max_tokens) of a text or
    token-id prompt, asking for the generated token ids (vLLM's `return_token_ids`; other servers ignore it)."""
    exact = {"max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True, "return_token_ids": True}
    return {"model": model, "prompt": prompt, "temperature": 0, "stream": False} | exact


def generate_exactly(
    base_url: str, model: str, prompt: str | list[int], tokens: int, timeout_s: float = 600.0
) -> Answer:
    """The answer to exact_completion_body(model, prompt, tokens)."""
    body = _post(f"{base_url.rstrip('/')}/v1/completions", exact_completion_body(model, prompt, tokens), timeout_s)
    try:
        choice: dict[str, Any] = body["choices"][0]  # type: ignore[index]
        ids, usage = choice.get("token_ids"), body.get("usage")
        return Answer(
            text=str(choice.get("text") or ""),
            token_ids=[int(t) for t in ids] if isinstance(ids, list) else None,
            completion_tokens=int(usage["completion_tokens"]) if isinstance(usage, dict) else None,
        )
    except (KeyError, IndexError, TypeError, ValueError) as error:
        raise UserError(f"{base_url} answered without a completion ({error!r}); is it an OpenAI server?") from None


def tokenize(base_url: str, model: str, text: str, timeout_s: float = 30.0) -> list[int] | None:
    """Token ids from the server's /tokenize (vLLM and the embedded engine have it), or None without one."""
    try:
        body = _post(
            f"{base_url.rstrip('/')}/tokenize", {"model": model, "prompt": text, "add_special_tokens": False}, timeout_s
        )
    except UserError:
        return None
    tokens = body.get("tokens")
    return [int(t) for t in tokens] if isinstance(tokens, list) else None
