"""Exporters: import -> export -> import keeps every field the target format carries."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from harness.errors import UserError
from harness.records.trace_schema import META_BLOCK_SIZE
from harness.trace.exporters import export_trace
from harness.trace.importers import import_trace
from harness.trace.importers.common import ImportOptions
from tests.trace.support import AZURE_CONV, BURSTGPT, write_jsonl
from tests.trace.test_length_jsonl import MOONCAKE_ROWS


def columns(trace, *names):
    return {name: trace.table.column(name).to_pylist() for name in names}


@pytest.mark.parametrize("fmt", ["mooncake", "vllm-timed"])
def test_length_jsonl_round_trip_is_lossless(tmp_path, fmt):
    first = import_trace(fmt, write_jsonl(tmp_path / "src.jsonl", MOONCAKE_ROWS)).trace
    export_trace(first, tmp_path / "out.jsonl", fmt)
    again = import_trace(fmt, tmp_path / "out.jsonl").trace
    fields = ("arrival_s", "prompt_tokens", "output_tokens", "prefix_block_ids")
    assert columns(again, *fields) == columns(first, *fields)
    assert again.metadata[META_BLOCK_SIZE] == first.metadata[META_BLOCK_SIZE]


def test_mooncake_export_writes_milliseconds_and_vllm_writes_seconds(tmp_path):
    trace = import_trace("mooncake", write_jsonl(tmp_path / "src.jsonl", MOONCAKE_ROWS)).trace
    export_trace(trace, tmp_path / "m.jsonl", "mooncake")
    export_trace(trace, tmp_path / "v.jsonl", "vllm-timed")
    mooncake = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    timed = [json.loads(line) for line in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert mooncake == MOONCAKE_ROWS
    assert [row["timestamp"] for row in timed] == [0.0, 1.5, 1.5, 4.25]


def test_count_only_trace_gets_unique_blocks_covering_each_prompt(tmp_path):
    trace = import_trace("azure", AZURE_CONV).trace.slice(limit=500)
    result = export_trace(trace, tmp_path / "v.jsonl", "vllm-timed")
    assert result.synthesised_rows == 500
    again = import_trace("vllm-timed", tmp_path / "v.jsonl").trace
    assert again.arrivals.to_pylist() == trace.arrivals.to_pylist()  # seconds survive exactly
    blocks = again.table.column("prefix_block_ids").to_pylist()
    prompts = trace.table.column("prompt_tokens").to_pylist()
    assert [len(b) for b in blocks] == [math.ceil(p / 16) for p in prompts]
    flat = [b for row in blocks for b in row]
    assert len(flat) == len(set(flat))  # never shared: no fake prefix reuse
    assert any("--timed-trace-chunk-hash-size 16" in note for note in result.notes)


def test_mooncake_export_of_a_second_resolution_trace_rounds_to_milliseconds(tmp_path):
    trace = import_trace("azure", AZURE_CONV).trace.slice(limit=300)
    export_trace(trace, tmp_path / "m.jsonl", "mooncake")
    again = import_trace("mooncake", tmp_path / "m.jsonl").trace
    assert np.abs(again.arrivals.to_numpy() - trace.arrivals.to_numpy()).max() <= 0.0005 + 1e-12
    assert columns(again, "prompt_tokens", "output_tokens") == columns(trace, "prompt_tokens", "output_tokens")


def test_synthesised_blocks_never_collide_with_recorded_ones(tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [40, 41]},
        {"timestamp": 1, "input_length": 700, "output_length": 1},
    ]
    trace = import_trace("vllm-timed", write_jsonl(tmp_path / "s.jsonl", rows), ImportOptions(block_size=512)).trace
    result = export_trace(trace, tmp_path / "m.jsonl", "mooncake")
    written = [json.loads(line)["hash_ids"] for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert written == [[40, 41], [42, 43]]
    assert result.synthesised_rows == 1


def test_block_size_other_than_the_formats_is_called_out(tmp_path):
    trace = import_trace("vllm-timed", write_jsonl(tmp_path / "s.jsonl", MOONCAKE_ROWS)).trace
    result = export_trace(trace, tmp_path / "m.jsonl", "mooncake")
    assert any("import back with --block-size 16" in note for note in result.notes)


def test_unwritable_destination_is_a_user_error_and_leaves_nothing(tmp_path):
    trace = import_trace("burstgpt", BURSTGPT).trace
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UserError, match="cannot write the export"):
        export_trace(trace, blocker / "out.jsonl", "mooncake")
    assert blocker.read_text() == "x"
