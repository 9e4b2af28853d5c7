"""A small, real OpenAI-compatible HTTP upstream for tests and benchmarks (aiohttp, its own process).

Run it:   python -m tests.support.openai_server --port 0 --port-file PORT_FILE [options]
It binds 127.0.0.1, prints `listening on http://127.0.0.1:PORT` and writes PORT to --port-file once ready.
From a test use the context manager (starts it in its own process group, always stops it):

    from tests.support.openai_server import upstream
    with upstream(mode="ok", token_delay=0.001, log=tmp_path / "log.jsonl") as base_url:
        ...  # base_url == "http://127.0.0.1:PORT"

Endpoints
- POST /v1/completions, /v1/chat/completions: streaming SSE (`"stream": true`; a final chunk with `usage`
  when `stream_options.include_usage`) or one JSON body. Output is deterministic: token i is the word
  ` t<i>`, except that with `--diverge-every N` a non-streamed answer to a prompt whose text hashes (`diverges`)
  to a multiple of N says ` d<i>` from token `--diverge-at` K on (a model that changed its answer). A JSON body with
  `"return_token_ids": true` carries the choice's `token_ids` (the /tokenize ids of its words), as vLLM's do.
  Length: `max_tokens` (default 16) when `ignore_eos` is true; otherwise the "model" stops at
  `max(min_tokens, --natural-len)` capped by max_tokens, with finish_reason "stop" (else "length").
  Chat streams a role-only first chunk (no token), then one chunk per token, or `--chunk-tokens` (cycled)
  tokens per chunk; `--empty-every N` gives every Nth chunk empty text although it carries its tokens. With
  `stream_options.continuous_usage_stats` every chunk carries the cumulative usage, as vLLM's do.
- GET /v1/models, GET /health.
- POST /tokenize {"prompt": str} or {"messages": [...]} -> {"count", "max_model_len", "tokens"}.
  Tokenizer: whitespace words (token i of a prompt is its i-th word). Chat is templated as
  `<|role|> content <|end|>` per message, so each message costs 2 tokens on top of its words.
  `usage.prompt_tokens` uses the same count.

Options: --mode {ok,stall,drop,429,500,slow-first}, --fault-after K (tokens sent before stall/drop, default 2),
--fault-every N (fault only requests whose arrival number is a multiple of N, default 1 = all), --token-delay S
(between tokens, on a fixed grid: token i is due i × S after the first, so wake-up errors never add up),
--first-token-delay S (before the first token; mode slow-first uses it), --natural-len N, --log FILE (JSONL, one
line per generation request: `seq`, `path`, `recv_mono_ns` (time.monotonic_ns at handler entry; CLOCK_MONOTONIC is
system-wide on Linux, so it is directly comparable with a client's time.monotonic on the same host),
`recv_real_ns` (time.time_ns), `request_id` (the `X-Request-Id` header, null without one), `body` (the raw request
body, decoded as UTF-8)), --procs N (N processes accept on one socket, for load benchmarks; fault counting
(--fault-every, `seq`) is then per process), --no-tokenize (no /tokenize route: a server like most non-vLLM ones),
--burst (mode ok, streaming, no delays: the whole SSE answer in one write, rendered once per length and kept, so
the server spends almost nothing per token and any client reading it is the bottleneck; for saturating a replay
worker).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

MODES = ("ok", "stall", "drop", "429", "500", "slow-first")
MODEL_NAME = "test-model"
MAX_MODEL_LEN = 1_000_000
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Behaviour:
    """How the upstream answers; fixed for the life of the process."""

    mode: str = "ok"
    fault_after: int = 2
    fault_every: int = 1
    token_delay: float = 0.0
    first_token_delay: float = 0.0
    natural_len: int = 8
    burst: bool = False
    chunk_tokens: tuple[int, ...] = (1,)  # tokens per streamed chunk, cycled (a chunk of k waits k token delays)
    empty_every: int = 0  # every Nth chunk carries its tokens with empty text (0 = never)
    diverge_every: int = 0  # requests whose prompt hashes to a multiple of this change their answer (0 = never)
    diverge_at: int = 0  # ...from this output token on


def token_id(word: str) -> int:
    """The id of a word, in /tokenize and in `token_ids` alike."""
    return zlib.crc32(word.encode()) % 50_000


def diverges(words: list[str], every: int) -> bool:
    """Whether a request with these prompt words gets the changed answer under `--diverge-every every`."""
    return every > 0 and zlib.crc32(" ".join(words).encode()) % every == 0


def count_words(text: str) -> int:
    return len(text.split())


def chat_template_words(messages: list[dict[str, Any]]) -> list[str]:
    """The words of the templated chat prompt: `<|role|> content <|end|>` per message."""
    words: list[str] = []
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):  # OpenAI content parts
            content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
        words += [f"<|{message.get('role', 'user')}|>", *str(content).split(), "<|end|>"]
    return words


def prompt_words(body: dict[str, Any]) -> list[str]:
    if "messages" in body:
        return chat_template_words(body["messages"])
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        prompt = " ".join(str(p) for p in prompt)
    return str(prompt).split()


def output_length(body: dict[str, Any], natural_len: int) -> tuple[int, str]:
    """(tokens to generate, finish_reason) for a generation request."""
    max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    if body.get("ignore_eos"):
        return max_tokens, "length"
    wanted = max(int(body.get("min_tokens") or 0), natural_len)
    return (max_tokens, "length") if wanted >= max_tokens else (wanted, "stop")


class Upstream:
    """Request handlers plus the JSONL request log."""

    def __init__(self, behaviour: Behaviour, log: int | None) -> None:
        self.behaviour = behaviour
        self.log = log
        self.seq = 0

    def _faulted(self, seq: int) -> bool:
        return self.behaviour.mode != "ok" and seq % self.behaviour.fault_every == 0

    def answer_words(self, body: dict[str, Any], n_out: int) -> list[str]:
        """The `n_out` words of a non-streamed answer, changed from `--diverge-at` on for a diverging prompt."""
        changed = diverges(prompt_words(body), self.behaviour.diverge_every)
        return [f"d{i}" if changed and i >= self.behaviour.diverge_at else f"t{i}" for i in range(n_out)]

    async def generate(self, request: web.Request) -> web.StreamResponse:
        recv_mono_ns, recv_real_ns = time.monotonic_ns(), time.time_ns()
        seq = self.seq
        self.seq += 1
        raw = await request.read()
        if self.log is not None:  # one O_APPEND write per line: whole lines even with --procs > 1
            line = (
                json.dumps(
                    {
                        "seq": seq,
                        "path": request.path,
                        "recv_mono_ns": recv_mono_ns,
                        "recv_real_ns": recv_real_ns,
                        "request_id": request.headers.get("X-Request-Id"),
                        "body": raw.decode("utf-8"),
                    }
                )
                + "\n"
            )
            os.write(self.log, line.encode())
        try:
            body = json.loads(raw)
        except ValueError:
            return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
        mode = self.behaviour.mode if self._faulted(seq) else "ok"
        if mode in ("429", "500"):
            return web.json_response({"error": {"message": f"injected {mode}", "code": int(mode)}}, status=int(mode))
        chat = request.path.endswith("/chat/completions")
        n_out, finish = output_length(body, self.behaviour.natural_len)
        usage = {
            "prompt_tokens": len(prompt_words(body)),
            "completion_tokens": n_out,
            "total_tokens": len(prompt_words(body)) + n_out,
        }
        first_delay = self.behaviour.first_token_delay if mode in ("slow-first", "ok") else 0.0
        if body.get("stream") and self.behaviour.burst:
            with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._burst(request, chat, n_out, finish, usage, with_usage)
        if body.get("stream"):
            return await self._stream(request, body, chat, n_out, finish, usage, mode, first_delay)
        return await self._whole(request, body, chat, n_out, finish, usage, mode, first_delay)

    async def _whole(
        self,
        request: web.Request,
        body: dict[str, Any],
        chat: bool,
        n_out: int,
        finish: str,
        usage: dict[str, int],
        mode: str,
        first_delay: float,
    ) -> web.StreamResponse:
        if mode == "stall":
            await asyncio.sleep(3600)
        if mode == "drop":
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        await asyncio.sleep(first_delay + self.behaviour.token_delay * max(n_out - 1, 0))
        words = self.answer_words(body, n_out)
        text = "".join(f" {w}" for w in words)
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if body.get("return_token_ids"):
            choice["token_ids"] = [token_id(w) for w in words]
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice |= {"text": text, "logprobs": None}
        return web.json_response(
            {
                "id": "cmpl-test",
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": body.get("model") or MODEL_NAME,
                "choices": [choice],
                "usage": usage,
            }
        )

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        chat: bool,
        n_out: int,
        finish: str,
        usage: dict[str, int],
        mode: str,
        first_delay: float,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        model = body.get("model") or MODEL_NAME
        head = {
            "id": "cmpl-test",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
        }

        async def send(choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> None:
            await response.write(b"data: " + json.dumps(head | {"choices": choices} | (extra or {})).encode() + b"\n\n")

        continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))

        def usage_so_far(done: int) -> dict[str, Any]:
            if not continuous:
                return {}
            return {"usage": usage | {"completion_tokens": done, "total_tokens": usage["prompt_tokens"] + done}}

        if chat:
            opener = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            await send([opener], usage_so_far(0))
        if first_delay:
            await asyncio.sleep(first_delay)
        done, chunk, first_at = 0, 0, time.monotonic()
        while done < n_out:
            if mode in ("stall", "drop") and done >= self.behaviour.fault_after:
                if mode == "drop":
                    assert request.transport is not None
                    request.transport.close()
                    return response
                await asyncio.sleep(3600)
            k = min(self.behaviour.chunk_tokens[chunk % len(self.behaviour.chunk_tokens)], n_out - done)
            if done and self.behaviour.token_delay:  # against a deadline, so a busy host keeps the pace
                deadline = first_at + (done + k - 1) * self.behaviour.token_delay
                await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            empty = self.behaviour.empty_every and (chunk + 1) % self.behaviour.empty_every == 0
            piece = "" if empty else "".join(f" t{i}" for i in range(done, done + k))
            done, chunk = done + k, chunk + 1
            choice = (
                {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece, "logprobs": None}
            )
            await send([choice | {"finish_reason": finish if done == n_out else None}], usage_so_far(done))
        if n_out == 0:
            await send([{"index": 0, "finish_reason": finish} | ({"delta": {}} if chat else {"text": ""})])
        if (body.get("stream_options") or {}).get("include_usage"):
            await send([], {"usage": usage})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _burst(
        self, request: web.Request, chat: bool, n_out: int, finish: str, usage: dict[str, int], with_usage: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        await response.write(burst_body(chat, n_out, finish))
        tail = b"data: " + json.dumps({"id": "cmpl-test", "choices": [], "usage": usage}).encode() + b"\n\n"
        await response.write((tail if with_usage else b"") + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        words = prompt_words(body)
        return web.json_response(
            {
                "count": len(words),
                "max_model_len": MAX_MODEL_LEN,
                "tokens": [token_id(w) for w in words],
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "replaybench-tests"}]}
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")


@functools.cache
def burst_body(chat: bool, n_out: int, finish: str) -> bytes:
    """Every token chunk of an answer of `n_out` tokens as one byte string (SSE events, one token each)."""
    head = {"id": "cmpl-test", "object": "chat.completion.chunk" if chat else "text_completion", "model": MODEL_NAME}
    events = []
    for i in range(n_out):
        piece = {"content": f" t{i}"}
        choice = {"index": 0, "delta": piece} if chat else {"index": 0, "text": piece["content"], "logprobs": None}
        choice["finish_reason"] = finish if i == n_out - 1 else None
        events.append(b"data: " + json.dumps(head | {"choices": [choice]}).encode() + b"\n\n")
    return b"".join(events)


def build_app(upstream_: Upstream, tokenize: bool = True) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/completions", upstream_.generate)
    app.router.add_post("/v1/chat/completions", upstream_.generate)
    if tokenize:
        app.router.add_post("/tokenize", upstream_.tokenize)
    app.router.add_get("/v1/models", upstream_.models)
    app.router.add_get("/health", upstream_.health)
    return app


async def serve(args: argparse.Namespace, sock: socket.socket, primary: bool) -> None:
    behaviour = Behaviour(
        mode=args.mode,
        fault_after=args.fault_after,
        fault_every=args.fault_every,
        token_delay=args.token_delay,
        first_token_delay=args.first_token_delay,
        natural_len=args.natural_len,
        chunk_tokens=tuple(int(k) for k in args.chunk_tokens.split(",")),
        empty_every=args.empty_every,
        diverge_every=args.diverge_every,
        diverge_at=args.diverge_at,
        burst=args.burst,
    )
    log = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if args.log else None
    app = build_app(Upstream(behaviour, log), tokenize=not args.no_tokenize)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    port = sock.getsockname()[1]
    if primary and args.port_file:
        tmp = Path(f"{args.port_file}.tmp")
        tmp.write_text(str(port))
        tmp.replace(args.port_file)
    if primary:
        print(f"listening on http://127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    if log is not None:
        os.close(log)


def main(args: argparse.Namespace) -> None:
    """Bind once, then fork `--procs - 1` more server processes that accept on the same socket."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(4096)
    sock.setblocking(False)
    primary = True
    for _ in range(args.procs - 1):
        if os.fork() == 0:
            primary = False
            break
    asyncio.run(serve(args, sock, primary))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="OpenAI-compatible test upstream (see module docstring)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file")
    parser.add_argument("--mode", choices=MODES, default="ok")
    parser.add_argument("--fault-after", type=int, default=2)
    parser.add_argument("--fault-every", type=int, default=1)
    parser.add_argument("--token-delay", type=float, default=0.0)
    parser.add_argument("--first-token-delay", type=float, default=0.0)
    parser.add_argument("--natural-len", type=int, default=8)
    parser.add_argument("--log")
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--no-tokenize", action="store_true")
    parser.add_argument("--burst", action="store_true")
    parser.add_argument("--chunk-tokens", default="1", help="tokens per chunk, cycled, e.g. 1,3,2,4")
    parser.add_argument("--empty-every", type=int, default=0, help="every Nth chunk has empty text")
    parser.add_argument("--diverge-every", type=int, default=0, help="answers of 1 in N prompts change")
    parser.add_argument("--diverge-at", type=int, default=0, help="...from this output token on")
    return parser.parse_args(argv)


@contextlib.contextmanager
def upstream(
    mode: str = "ok",
    *,
    log: str | os.PathLike[str] | None = None,
    token_delay: float = 0.0,
    first_token_delay: float = 0.0,
    fault_after: int = 2,
    fault_every: int = 1,
    natural_len: int = 8,
    procs: int = 1,
    tokenize: bool = True,
    burst: bool = False,
    chunk_tokens: tuple[int, ...] = (1,),
    empty_every: int = 0,
    diverge_every: int = 0,
    diverge_at: int = 0,
    start_timeout_s: float = 30.0,
) -> Iterator[str]:
    """Start the upstream in its own process group; yield its base URL; always stop it (TERM, then KILL)."""
    with tempfile.TemporaryDirectory(prefix="rb-upstream-") as tmp:
        port_file = Path(tmp) / "port"
        cmd = [
            sys.executable,
            "-m",
            "tests.support.openai_server",
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--mode",
            mode,
            "--token-delay",
            str(token_delay),
            "--first-token-delay",
            str(first_token_delay),
            "--fault-after",
            str(fault_after),
            "--fault-every",
            str(fault_every),
            "--natural-len",
            str(natural_len),
            "--procs",
            str(procs),
            "--chunk-tokens",
            ",".join(map(str, chunk_tokens)),
            "--empty-every",
            str(empty_every),
            "--diverge-every",
            str(diverge_every),
            "--diverge-at",
            str(diverge_at),
        ] + ([] if tokenize else ["--no-tokenize"])
        if burst:
            cmd.append("--burst")
        if log is not None:
            cmd += ["--log", str(log)]
        env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        stderr_path = Path(tmp) / "stderr"
        with open(stderr_path, "wb") as stderr:
            proc = subprocess.Popen(
                cmd, cwd=REPO_ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=stderr
            )
        try:
            deadline = time.monotonic() + start_timeout_s
            while not port_file.exists():
                if proc.poll() is not None:
                    raise RuntimeError(f"test upstream exited early: {stderr_path.read_text()[-2000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError("test upstream did not start in time")
                time.sleep(0.02)
            yield f"http://127.0.0.1:{int(port_file.read_text())}"
        finally:
            stop_process_group(proc)


def stop_process_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the process group, wait, then SIGKILL whatever is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def read_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The upstream's JSONL request log, in arrival order."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    main(parse_args())
