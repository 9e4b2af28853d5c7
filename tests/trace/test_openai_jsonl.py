"""openai-jsonl importer: logged request bodies with timestamps (text, model and params are kept)."""

from __future__ import annotations

import json

import pytest

from harness.errors import UserError
from harness.records.trace_schema import META_REDACTION, META_TOKENIZER
from harness.trace.importers import import_trace
from tests.trace.support import write_jsonl

CHAT = {
    "timestamp": "2024-05-10T12:00:01.5Z",
    "url": "/v1/chat/completions",
    "session_id": "s1",
    "body": {
        "model": "m1",
        "messages": [{"role": "user", "content": "hi there"}],
        "temperature": 0.2,
        "max_tokens": 50,
    },
}
COMPLETION = {
    "timestamp": "2024-05-10T12:00:00Z",
    "model": "m2",
    "prompt": "Once upon a time",
    "max_tokens": 20,
    "stop": ["\n"],
    "usage": {"prompt_tokens": 4, "completion_tokens": 17},
    "tenant": "acme",
}


def test_both_line_shapes_keep_text_model_params_and_counts(tmp_path):
    result = import_trace("openai-jsonl", write_jsonl(tmp_path / "log.jsonl", [CHAT, COMPLETION]))
    rows = result.trace.table.to_pylist()
    completion, chat = rows  # sorted by time: the completion came first
    assert completion["arrival_s"] == 0.0 and chat["arrival_s"] == 1.5
    assert completion["api"] == "completions" and completion["prompt"] == "Once upon a time"
    assert completion["model"] == "m2" and completion["tenant"] == "acme"
    assert (completion["prompt_tokens"], completion["output_tokens"]) == (4, 17)
    assert json.loads(completion["params"]) == {"max_tokens": 20, "stop": ["\n"]}
    assert chat["api"] == "chat" and json.loads(chat["messages"]) == CHAT["body"]["messages"]
    assert chat["session_id"] == "s1" and chat["output_tokens"] == 50
    assert json.loads(chat["params"]) == {"temperature": 0.2, "max_tokens": 50}
    assert chat["prompt_tokens"] == 10  # estimated: 37 bytes of JSON / 4, rounded up
    assert result.trace.metadata[META_REDACTION] == "none"
    assert "estimated" in result.trace.metadata[META_TOKENIZER]
    assert chat["request_id"] == "openai-log-000000"


def test_numeric_timestamps_and_explicit_counts(tmp_path):
    lines = [
        {"timestamp": 1700000000.25, "prompt": "a", "prompt_tokens": 3, "output_tokens": 4},
        {"timestamp": 1700000001.0, "body": {"prompt": ["b"], "max_completion_tokens": 9}},
    ]
    trace = import_trace("openai-jsonl", write_jsonl(tmp_path / "log.jsonl", lines)).trace
    assert trace.arrivals.to_pylist() == [0.0, 0.75]
    assert trace.table.column("output_tokens").to_pylist() == [4, 9]
    assert trace.table.column("prompt").to_pylist() == ["a", "b"]
    assert META_TOKENIZER in trace.metadata  # the second prompt length was estimated


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ({"prompt": "a", "max_tokens": 1}, "missing field 'timestamp'"),
        ({"timestamp": "noon", "prompt": "a", "max_tokens": 1}, "not an ISO-8601 datetime"),
        ({"timestamp": 0, "prompt": "a"}, "no output length"),
        ({"timestamp": 0, "prompt": [1, 2, 3], "max_tokens": 1}, "needs a text 'prompt'"),
        ({"timestamp": 0, "messages": [], "max_tokens": 1}, "non-empty 'messages'"),
        ({"timestamp": 0, "body": "text", "max_tokens": 1}, "'body' must be a JSON object"),
        ({"timestamp": 0, "prompt": "a", "max_tokens": -3}, "'max_tokens' is -3"),
        ({"timestamp": 0, "prompt": "a", "max_tokens": 1, "model": ["x"]}, "'model' must be text"),
    ],
    ids=["no-time", "bad-time", "no-output", "token-prompt", "empty-messages", "body", "negative", "model"],
)
def test_malformed_request_log_is_one_clear_user_error(tmp_path, line, expected):
    with pytest.raises(UserError) as caught:
        import_trace("openai-jsonl", write_jsonl(tmp_path / "log.jsonl", [line]))
    assert expected in str(caught.value)
    assert "log.jsonl:1:" in str(caught.value)


def test_unpaired_surrogate_escape_is_a_user_error(tmp_path):
    src = tmp_path / "log.jsonl"
    src.write_text('{"timestamp": 0, "prompt": "a\\ud800b", "max_tokens": 3}\n')
    with pytest.raises(UserError, match=r"log\.jsonl:1: the text holds an unpaired UTF-16 surrogate"):
        import_trace("openai-jsonl", src)


def test_mixed_timestamp_forms_are_rejected(tmp_path):
    lines = [
        {"timestamp": 0, "prompt": "a", "max_tokens": 1},
        {"timestamp": "2024-01-01T00:00:00", "prompt": "b", "max_tokens": 1},
    ]
    with pytest.raises(UserError, match="mix numbers and ISO-8601"):
        import_trace("openai-jsonl", write_jsonl(tmp_path / "log.jsonl", lines))
