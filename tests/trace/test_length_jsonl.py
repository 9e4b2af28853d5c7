"""Mooncake and vLLM timed_trace importers (same fields, different time unit and block size)."""

from __future__ import annotations

import pytest

from harness.errors import UserError
from harness.records.trace_schema import META_BLOCK_SIZE, META_REDACTION
from harness.trace.importers import import_trace
from harness.trace.importers.common import ImportOptions
from tests.trace.support import write_jsonl, write_lines

MOONCAKE_ROWS = [
    {"timestamp": 0, "input_length": 1000, "output_length": 20, "hash_ids": [0, 1]},
    {"timestamp": 1500, "input_length": 1100, "output_length": 30, "hash_ids": [0, 1, 2]},
    {"timestamp": 1500, "input_length": 300, "output_length": 5, "hash_ids": [7]},
    {"timestamp": 4250, "input_length": 600, "output_length": 1, "hash_ids": [0, 8]},
]


def test_mooncake_milliseconds_blocks_and_block_size(tmp_path):
    result = import_trace("mooncake", write_jsonl(tmp_path / "conversation_trace.jsonl", MOONCAKE_ROWS))
    trace = result.trace
    assert trace.arrivals.to_pylist() == [0.0, 1.5, 1.5, 4.25]
    assert trace.table.column("prompt_tokens").to_pylist() == [1000, 1100, 300, 600]
    assert trace.table.column("output_tokens").to_pylist() == [20, 30, 5, 1]
    assert trace.table.column("prefix_block_ids").to_pylist() == [r["hash_ids"] for r in MOONCAKE_ROWS]
    assert trace.metadata[META_BLOCK_SIZE] == "512"
    assert trace.metadata[META_REDACTION] == "hash"
    assert trace.table.column("request_id")[0].as_py() == "mooncake-conversation-trace-000000"


def test_vllm_timed_seconds_default_16_token_blocks_and_override(tmp_path):
    rows = [
        {"timestamp": 2.0, "input_length": 40, "output_length": 7, "hash_ids": [1, 2, 3]},
        {"timestamp": 3.25, "input_length": 32.0, "output_length": 9},
    ]
    src = write_jsonl(tmp_path / "timed.jsonl", rows)
    trace = import_trace("vllm-timed", src).trace
    assert trace.arrivals.to_pylist() == [0.0, 1.25]
    assert trace.table.column("prompt_tokens").to_pylist() == [40, 32]
    assert trace.table.column("prefix_block_ids").to_pylist() == [[1, 2, 3], None]
    assert trace.metadata[META_BLOCK_SIZE] == "16"
    assert import_trace("vllm-timed", src, ImportOptions(block_size=64)).trace.metadata[META_BLOCK_SIZE] == "64"


def test_unsigned_64_bit_block_hashes_keep_their_bits(tmp_path):
    src = write_jsonl(
        tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 16, "output_length": 1, "hash_ids": [2**64 - 1, 5]}]
    )
    assert import_trace("vllm-timed", src).trace.table.column("prefix_block_ids").to_pylist() == [[-1, 5]]


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (['{"timestamp": 0, "input_length": 1, "output_length": 1}', "{oops"], "t.jsonl:2: not valid JSON"),
        (["[1, 2, 3]"], "t.jsonl:1: expected a JSON object, got list"),
        (['{"timestamp": 0, "output_length": 1}'], "missing field 'input_length'"),
        (['{"timestamp": "soon", "input_length": 1, "output_length": 1}'], "field 'timestamp' is 'soon'"),
        (['{"timestamp": 0, "input_length": -1, "output_length": 1}'], "field 'input_length' is -1"),
        (['{"timestamp": 0, "input_length": 1.5, "output_length": 1}'], "field 'input_length' is 1.5"),
        (['{"timestamp": 0, "input_length": true, "output_length": 1}'], "field 'input_length' is True"),
        (['{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": "abc"}'], "list of integer block"),
        (['{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1.5]}'], "list of integer block"),
        (["", "  "], "no requests"),
    ],
    ids=["json", "not-object", "missing", "timestamp", "negative", "fraction", "bool", "hashes", "float-hash", "blank"],
)
def test_malformed_length_jsonl_is_one_clear_user_error(tmp_path, lines, expected):
    src = write_lines(tmp_path / "t.jsonl", lines)
    for fmt in ("mooncake", "vllm-timed"):
        with pytest.raises(UserError) as caught:
            import_trace(fmt, src)
        assert expected in str(caught.value)


def test_block_size_must_be_positive(tmp_path):
    src = write_jsonl(tmp_path / "t.jsonl", MOONCAKE_ROWS)
    with pytest.raises(UserError, match="--block-size must be at least 1"):
        import_trace("mooncake", src, ImportOptions(block_size=0))
