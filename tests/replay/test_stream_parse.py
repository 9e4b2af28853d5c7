"""SSE parsing does not depend on how the bytes were split into reads."""

from __future__ import annotations

import json

from harness.replay.result_row import ResultRow
from harness.replay.stream_parse import StreamReader


def chat_stream() -> bytes:
    def event(obj: object) -> bytes:
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    tokens = [
        {"choices": [{"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": "length" if i == 2 else None}]}
        for i in range(3)
    ]
    usage = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}
    return b"".join(event(e) for e in [role, *tokens, usage]) + b": keep-alive comment\n\ndata: [DONE]"


def parse(pieces: list[bytes]) -> tuple[ResultRow, StreamReader]:
    row = ResultRow(
        request_id="r", arm="a", repeat=0, intended_s=0.0, worker=0, prompt_tokens=7, expected_output_tokens=3
    )
    reader = StreamReader(row, keep_text=True)
    for i, piece in enumerate(pieces):
        reader.feed_bytes(piece, float(i))
    reader.feed_bytes(b"\n", float(len(pieces)))
    reader.finish()
    return row, reader


def test_any_split_gives_the_same_result() -> None:
    data = chat_stream()
    whole, whole_reader = parse([data])
    assert whole_reader.done and whole_reader.server_error is None
    assert (whole.output_tokens, whole.output_tokens_usage, whole.prompt_tokens_server) == (3, 3, 7)
    assert (whole.finish_reason, whole.output_text, whole.token_times) == ("length", " w0 w1 w2", [0.0, 0.0, 0.0])
    for size in (1, 7, 50):
        row, reader = parse([data[i : i + size] for i in range(0, len(data), size)])
        assert reader.done and (row.output_tokens, row.output_text, row.finish_reason) == (3, " w0 w1 w2", "length")
        assert row.token_times == sorted(row.token_times) and row.ttft_s == row.token_times[0]


def test_error_event_and_missing_done_are_visible() -> None:
    row, reader = parse([b'data: {"error": {"message": "boom"}}\n\n'])
    assert reader.server_error is not None and not reader.done and row.output_tokens == 0 and row.ttft_s is None
