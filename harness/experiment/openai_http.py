"""The few blocking OpenAI-API calls the experiment makes outside the replay: warm-up and quality tasks.

Greedy (temperature 0), non-streaming, one at a time: these requests are never measured.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

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
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/v1/models", timeout=timeout_s) as response:
            return str(json.loads(response.read())["data"][0]["id"])
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as error:
        raise UserError(f"{base_url}/v1/models lists no model ({error}); set the arm's `model`") from None


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
