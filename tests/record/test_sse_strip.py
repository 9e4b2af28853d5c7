"""Stripping the usage the proxy asked for leaves exactly the bytes the client would have got."""

from __future__ import annotations

import json

import pytest

from harness.record import observe
from harness.record.observe import LATER_LIMIT, BodyObserver, ResponseOutcome, SseObserver
from harness.record.sse import events, json_payload, without_key


def _openai_style_stream(include_usage: bool, separators: tuple[str, str] = (",", ":")) -> bytes:
    """Like api.openai.com: with include_usage every chunk gets `"usage":null` and a usage-only chunk comes last."""
    events = []
    for i, (text, finish) in enumerate([("", None), ("Hel", None), ("lo", None), ("", "stop")]):
        chunk: dict[str, object] = {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 1,
            "choices": [
                {"index": 0, "delta": {"content": text} if i else {"role": "assistant"}, "finish_reason": finish}
            ],
        }
        if include_usage:
            chunk["usage"] = None
        events.append(chunk)
    if include_usage:
        events.append(
            {
                "id": "c1",
                "object": "chat.completion.chunk",
                "created": 1,
                "choices": [],
                "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
            }
        )
    body = b"".join(b"data: " + json.dumps(e, separators=separators).encode() + b"\n\n" for e in events)
    return body + b"data: [DONE]\n\n"


def _run(observer: SseObserver, stream: bytes, piece: int) -> bytes:
    out = [observer.feed(stream[i : i + piece], float(i)) for i in range(0, len(stream), piece)]
    return b"".join(out) + observer.close(float(len(stream)))


@pytest.mark.parametrize("piece", [1, 7, 64, 10_000])
@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")])
def test_strip_restores_the_stream_without_usage(piece: int, separators: tuple[str, str]) -> None:
    observer = SseObserver(strip_usage=True)
    out = _run(observer, _openai_style_stream(True, separators), piece)
    assert out == _openai_style_stream(False, separators)
    outcome = observer.outcome
    assert (outcome.prompt_tokens, outcome.completion_tokens, outcome.finish_reason) == (9, 2, "stop")
    assert outcome.first_token_at is not None


def test_pass_through_forwards_every_chunk_immediately() -> None:
    stream = _openai_style_stream(True)
    observer = SseObserver(strip_usage=False)
    pieces = [stream[i : i + 5] for i in range(0, len(stream), 5)]
    assert [observer.feed(p, 0.0) for p in pieces] == pieces
    assert observer.close(0.0) == b""
    assert observer.outcome.completion_tokens == 2


def test_first_token_time_is_the_first_chunk_with_text() -> None:
    observer = SseObserver(strip_usage=False)
    stream = _openai_style_stream(False)
    events = stream.split(b"\n\n")
    for t, event in enumerate(events[:-1]):
        observer.feed(event + b"\n\n", float(t))
    assert observer.outcome.first_token_at == 1.0  # event 0 is role-only


def test_crlf_events_and_unterminated_tail() -> None:
    stream = _openai_style_stream(True).replace(b"\n", b"\r\n")
    observer = SseObserver(strip_usage=True)
    out = _run(observer, stream[:-4], 3)  # the last event lacks its blank line
    assert out == _openai_style_stream(False).replace(b"\n", b"\r\n")[:-4]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a":1,"usage":null}',
        b'{"usage":null,"a":1}',
        b'{"a": 1, "usage": {"x": [1, {"y": "}"}]}, "b": 2}',
        b'{ "usage" : null }',
        b'{"a":"\\"usage\\":null","usage":null}',
    ],
)
def test_without_key_cuts_exactly_one_member(raw: bytes) -> None:
    parsed = json.loads(raw)
    cut = without_key(raw, parsed, "usage")
    assert cut is not None and json.loads(cut) == {k: v for k, v in parsed.items() if k != "usage"}
    assert len(raw) - len(cut) >= len(b'"usage":null')


def test_non_sse_error_body_passes_untouched() -> None:
    body = b'{"error": {"message": "bad"}}'
    observer = SseObserver(strip_usage=True)
    assert observer.feed(body, 0.0) + observer.close(0.0) == body


def test_body_observer_reads_usage_and_finish() -> None:
    observer = BodyObserver(cap=1000)
    body = json.dumps(
        {"choices": [{"finish_reason": "stop", "text": "x"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
    ).encode()
    assert observer.feed(body[:10], 0.0) + observer.feed(body[10:], 0.0) == body
    observer.close(1.0)
    assert (observer.outcome.prompt_tokens, observer.outcome.completion_tokens) == (3, 1)
    assert observer.outcome.finish_reason == "stop"


def test_body_observer_gives_up_past_its_cap() -> None:
    observer = BodyObserver(cap=4)
    observer.feed(b'{"usage": {"prompt_tokens": 3}}', 0.0)
    observer.close(0.0)
    assert observer.outcome.prompt_tokens is None


def test_text_that_looks_like_sse_inside_json_is_left_alone() -> None:
    chunk = {"choices": [{"index": 0, "text": "data: x\n\ndata: y", "finish_reason": None}], "usage": None}
    stream = b"event: message\ndata: " + json.dumps(chunk).encode() + b"\n\n"
    observer = SseObserver(strip_usage=True)
    out = _run(observer, stream, 3)
    expected = {k: v for k, v in chunk.items() if k != "usage"}
    assert out == b"event: message\ndata: " + json.dumps(expected).encode() + b"\n\n"


def _vllm_style_stream(tokens: int, usage: bool, choices: int = 1) -> bytes:
    """Like vLLM: no usage member in token chunks; with include_usage one usage-only chunk before [DONE]."""
    chunks: list[dict[str, object]] = []
    for i in range(tokens):
        finish = ("stop", "length") if i == tokens - 1 else (None, None)
        chunks += [
            {"choices": [{"index": c, "text": f" t{i}", "finish_reason": finish[min(c, 1)]}]} for c in range(choices)
        ]
    if usage:
        chunks.append({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": tokens * choices}})
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def _staggered_finish_stream(usage: bool) -> bytes:
    """Two choices: the first finishes early ("length"), the other at the end ("stop"): the last one counts."""
    chunks: list[dict[str, object]] = [{"choices": [{"index": 1, "text": " a", "finish_reason": None}]}]
    chunks.append({"choices": [{"index": 0, "text": " b", "finish_reason": "length"}]})
    chunks += [{"choices": [{"index": 1, "text": f" t{i}", "finish_reason": None}]} for i in range(20)]
    chunks.append({"choices": [{"index": 1, "text": "", "finish_reason": "stop"}]})
    if usage:
        chunks.append({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 22}})
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def _every_event_read(stream: bytes) -> ResponseOutcome:
    """The reference: every event observed as it arrives."""
    outcome = ResponseOutcome()
    for event in events(stream):
        obj = json_payload(event)
        if obj is not None:
            outcome.observe(obj, 0.0)
    return outcome


@pytest.mark.parametrize("piece", [1, 7, 64, 10_000])
@pytest.mark.parametrize("strip", [True, False])
@pytest.mark.parametrize(
    "stream",
    [
        _openai_style_stream(True),
        _openai_style_stream(False),
        _vllm_style_stream(5, usage=True),
        _vllm_style_stream(5, usage=False),
        _vllm_style_stream(3, usage=True, choices=2),
        _vllm_style_stream(300, usage=True),
        _vllm_style_stream(300, usage=False),
        _staggered_finish_stream(usage=True),
        _staggered_finish_stream(usage=False),
    ],
)
@pytest.mark.parametrize("limit", [LATER_LIMIT, 3])  # 3: the oldest kept events are read as new ones come
def test_reading_later_events_lazily_gives_what_reading_every_event_gives(
    stream: bytes, strip: bool, piece: int, limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(observe, "LATER_LIMIT", limit)
    observer = SseObserver(strip_usage=strip)
    _run(observer, stream, piece)
    got, want = observer.outcome, _every_event_read(stream)
    assert (got.prompt_tokens, got.completion_tokens, got.finish_reason) == (
        want.prompt_tokens,
        want.completion_tokens,
        want.finish_reason,
    )
    if want.completion_tokens is None:  # no usage: the output length is the count of token chunks
        assert got.token_chunks == want.token_chunks > 0


def test_long_streams_are_read_on_the_way_so_memory_stays_bounded() -> None:
    stream = _vllm_style_stream(3000, usage=True)
    observer = SseObserver(strip_usage=False)
    for i in range(0, len(stream), 100):
        observer.feed(stream[i : i + 100], 0.0)
        assert len(observer._later) <= LATER_LIMIT
    observer.close(0.0)
    assert (observer.outcome.completion_tokens, observer.outcome.finish_reason) == (3000, "stop")
