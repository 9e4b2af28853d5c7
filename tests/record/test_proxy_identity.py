"""Through the proxy, clients get exactly what the upstream sends; the trace holds what happened.

One real upstream (tests.support.openai_server), one real recorder subprocess, real clients (aiohttp for raw
bytes, the official `openai` client for parsed objects). Every request goes once direct and once through
the proxy, and the two answers are compared.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import openai
import pytest

from harness.trace.model import Trace
from tests.record.recorder_process import recorder
from tests.record.traffic import (
    RawResponse,
    chat_body,
    chat_prompt_tokens,
    completion_body,
    encode,
    fetch_all,
    without_created,
)
from tests.support.openai_server import upstream

# (method, path, body); every generation request has a unique first word so its trace row can be found.
RAW_GENERATION = [
    ("POST", "/v1/chat/completions", chat_body("alpha one two three", 5, stream=True)),
    (
        "POST",
        "/v1/chat/completions",
        chat_body("bravo one two", 3, stream=True, stream_options={"include_usage": True}),
    ),
    ("POST", "/v1/chat/completions", chat_body("charlie one", 4)),
    ("POST", "/v1/completions", completion_body("delta one two three four", 6, stream=True)),
    ("POST", "/v1/completions", completion_body("echo", 2)),
    ("POST", "/v1/completions", completion_body("foxtrot zero", 1, stream=True)),
]
RAW_OTHER = [
    ("GET", "/v1/models", None),
    ("GET", "/health", None),
    ("GET", "/no/such/route?x=1&y=%20z", None),
    ("POST", "/v1/completions", b"{not json"),  # upstream answers 400; forwarded, not recorded
    ("POST", "/v1/completions", encode(completion_body("golf", "many"))),  # type: ignore[arg-type] # 500 upstream
]
OPENAI_CALLS = 4


@dataclass
class Session:
    direct: list[RawResponse]
    proxied: list[RawResponse]
    openai_direct: list[object]
    openai_proxied: list[object]
    trace: Trace
    summary: str


def _openai_calls(base_url: str) -> list[object]:
    """Four calls with the official client; results as plain data without the `created` stamp."""
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="sk-not-a-real-key-000000000000", max_retries=0)
    messages = [{"role": "system", "content": "hotel sys"}, {"role": "user", "content": "india question"}]
    stream = client.chat.completions.create(model="test-model", messages=messages, max_tokens=4, stream=True)
    chat_chunks = [chunk.model_dump(exclude={"created"}) for chunk in stream]
    usage_stream = client.completions.create(
        model="test-model", prompt="juliet a b", max_tokens=3, stream=True, stream_options={"include_usage": True}
    )
    usage_chunks = [chunk.model_dump(exclude={"created"}) for chunk in usage_stream]
    chat = client.chat.completions.create(model="test-model", messages=messages, max_tokens=2)
    completion = client.completions.create(model="test-model", prompt="kilo a", max_tokens=7)
    return [chat_chunks, usage_chunks, chat.model_dump(exclude={"created"}), completion.model_dump(exclude={"created"})]


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    tmp = tmp_path_factory.mktemp("identity")
    requests = [(m, p, encode(b) if isinstance(b, dict) else b) for m, p, b in RAW_GENERATION + RAW_OTHER]
    with upstream(token_delay=0.001) as base, recorder(base, tmp / "out" / "prod.parquet", logs=tmp) as rec:
        direct = fetch_all(requests, base)
        proxied = fetch_all(requests, rec.url)
        openai_direct = _openai_calls(base)
        openai_proxied = _openai_calls(rec.url)
        assert rec.stop() == 0
        summary = rec.output
    return Session(
        direct, proxied, openai_direct, openai_proxied, Trace.read(tmp / "out" / "prod-0001.parquet"), summary
    )


def test_raw_bytes_status_and_type_identical(session: Session) -> None:
    assert len(session.proxied) == len(RAW_GENERATION) + len(RAW_OTHER)
    for direct, proxied in zip(session.direct, session.proxied, strict=True):
        assert (proxied.status, proxied.content_type) == (direct.status, direct.content_type)
        assert without_created(proxied.body) == without_created(direct.body)
    statuses = [r.status for r in session.proxied]
    assert statuses[: len(RAW_GENERATION)] == [200] * len(RAW_GENERATION)
    assert statuses[len(RAW_GENERATION) :] == [200, 200, 404, 400, 500]


def test_streams_without_usage_request_get_no_usage_chunk(session: Session) -> None:
    """The proxy asked upstream for usage; a client that did not ask must not see it."""
    first = session.proxied[0].body
    assert b'"usage"' not in first and first.endswith(b"data: [DONE]\n\n")
    assert b'"usage"' in session.proxied[1].body  # this client asked for it


def test_openai_client_sees_the_same_objects(session: Session) -> None:
    assert session.openai_proxied == session.openai_direct
    chat_chunks, usage_chunks, chat, completion = session.openai_proxied
    assert "".join(c["choices"][0]["delta"]["content"] or "" for c in chat_chunks if c["choices"]) == " t0 t1 t2 t3"
    assert usage_chunks[-1]["usage"]["completion_tokens"] == 3
    assert all(c["usage"] is None for c in chat_chunks)
    assert chat["choices"][0]["message"]["content"] == " t0 t1"
    assert completion["usage"]["completion_tokens"] == 7


def _first_word(row: dict[str, object]) -> str:
    text = row["prompt"] or json.loads(row["messages"])[-1]["content"]  # type: ignore[arg-type]
    return str(text).split()[0]


def _row(trace: Trace, first_word: str) -> dict[str, object]:
    rows = [row for row in trace.table.to_pylist() if _first_word(row) == first_word]
    assert len(rows) == 1, (first_word, rows)
    return rows[0]


def test_trace_has_one_row_per_recorded_request(session: Session) -> None:
    # generation requests direct are not proxied; through the proxy: raw ones, the 500 one, and the openai calls
    assert len(session.trace) == len(RAW_GENERATION) + 1 + OPENAI_CALLS
    assert session.trace.metadata["redaction"] == "none"
    assert "recorded 11" in session.summary and "not recorded / incidents: bodies not JSON: 1" in session.summary


@pytest.mark.parametrize("index", range(len(RAW_GENERATION)))
def test_trace_rows_match_what_happened(session: Session, index: int) -> None:
    _, path, body = RAW_GENERATION[index]
    text = body.get("prompt") or body["messages"][0]["content"]
    row = _row(session.trace, text.split()[0])
    chat = path.endswith("chat/completions")
    assert row["api"] == ("chat" if chat else "completions")
    assert row["prompt_tokens"] == (chat_prompt_tokens(text) if chat else len(text.split()))
    assert row["output_tokens"] == body["max_tokens"]
    assert row["status"] == 200 and row["finish_reason"] == "length"
    assert row["model"] == "test-model"
    params = json.loads(row["params"])
    assert params["max_tokens"] == body["max_tokens"] and params.get("stream") == body.get("stream")
    assert params.get("stream_options") == body.get("stream_options")  # as the client sent it, not as proxied
    assert row["e2e_s"] > 0
    if body.get("stream"):
        assert 0 < row["ttft_s"] <= row["e2e_s"]
    else:
        assert row["ttft_s"] is None


def test_failed_request_recorded_with_its_status(session: Session) -> None:
    row = _row(session.trace, "golf")
    assert (row["status"], row["output_tokens"], row["finish_reason"]) == (500, 0, None)


def test_arrivals_follow_sending_order(session: Session) -> None:
    table = session.trace.table
    arrivals = table.column("arrival_s").to_pylist()
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    firsts = [_first_word(row) for row in table.to_pylist()]
    assert firsts[:7] == ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf"]
