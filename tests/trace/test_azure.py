"""Azure importer on the shipped real traces and on malformed files."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from harness.errors import UserError
from harness.records.trace_schema import META_CLOCK, META_REDACTION
from harness.trace.importers import import_trace
from tests.trace.support import AZURE_CODE, AZURE_CONV, write_lines

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def csv_sums(path):
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    return len(rows), sum(int(r["ContextTokens"]) for r in rows), sum(int(r["GeneratedTokens"]) for r in rows)


@pytest.mark.parametrize("path", [AZURE_CONV, AZURE_CODE], ids=["conv", "code"])
def test_real_azure_trace_keeps_every_row_and_token(path):
    rows, prompt_sum, output_sum = csv_sums(path)
    trace = import_trace("azure", path).trace
    arrivals = trace.arrivals.to_numpy()
    assert len(trace) == rows
    assert int(trace.table.column("prompt_tokens").to_numpy().sum()) == prompt_sum
    assert int(trace.table.column("output_tokens").to_numpy().sum()) == output_sum
    assert arrivals[0] == 0.0
    assert (np.diff(arrivals) >= 0).all()
    assert trace.metadata[META_REDACTION] == "drop"
    assert set(trace.table.column("api").to_pylist()) == {"completions"}


def test_conv_trace_has_the_documented_shape():
    trace = import_trace("azure", AZURE_CONV).trace
    assert len(trace) == 19_366
    assert trace.table.column("request_id")[0].as_py() == "azure-conv-000000"
    assert trace.metadata[META_CLOCK] == "2023-11-16 18:15:46.6805900"
    # second row is 2023-11-16 18:15:50.9951690: 4.3145790 s after the first, to the 100 ns of the source
    assert trace.arrivals[1].as_py() == pytest.approx(4.314579, abs=1e-9)
    assert trace.duration_s == pytest.approx(3501.72, abs=0.01)


def test_unsorted_rows_are_sorted_and_keep_their_source_row_ids(tmp_path):
    src = write_lines(
        tmp_path / "t.csv",
        [
            HEADER,
            "2024-01-01 00:00:02.5000000,10,1",
            "2024-01-01 00:00:01.0000000,20,2",
            "2024-01-01 00:00:03.0000000,30,3",
        ],
    )
    result = import_trace("azure", src)
    table = result.trace.table
    assert table.column("request_id").to_pylist() == ["azure-t-000001", "azure-t-000000", "azure-t-000002"]
    assert table.column("arrival_s").to_pylist() == [0.0, 1.5, 2.0]
    assert table.column("prompt_tokens").to_pylist() == [20, 10, 30]
    assert result.reordered_rows == 2


def test_bom_crlf_and_padded_header_are_accepted(tmp_path):
    src = tmp_path / "t.csv"
    src.write_bytes(
        b"\xef\xbb\xbfTIMESTAMP, ContextTokens, GeneratedTokens\r\n"
        b"2023-11-16 18:15:46.6805900, 3, 4\r\n2023-11-16 18:15:47.1805900,5,6\r\n"
    )
    trace = import_trace("azure", src).trace
    assert trace.table.column("prompt_tokens").to_pylist() == [3, 5]
    assert trace.arrivals.to_pylist() == [0.0, 0.5]


def test_utc_offset_timestamps_of_the_2024_release_parse(tmp_path):
    src = write_lines(
        tmp_path / "AzureLLMInferenceTrace_code_1week.csv",
        [HEADER, "2024-05-10 00:00:00.009453+00:00,5,6", "2024-05-10 00:00:01.509453+00:00,7,8"],
    )
    trace = import_trace("azure", src).trace
    assert trace.arrivals.to_pylist() == [0.0, 1.5]
    assert trace.table.column("request_id")[0].as_py() == "azure-code-1week-000000"


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([HEADER, "2023-11-16 18:15:46.6805900,1,2", "yesterday,3,4"], "TIMESTAMP has 'yesterday' at data row 2"),
        (
            [HEADER, "2023-11-16 18:15:46.6805900,1,2", "2023-11-16 18:15:47.0,x,4"],
            "ContextTokens has 'x' at data row 2",
        ),
        ([HEADER, "2023-11-16 18:15:46.6805900,1,-2"], "GeneratedTokens is -2 at data row 1"),
        ([HEADER, "2023-11-16 18:15:46.6805900,1,"], "GeneratedTokens is empty at data row 1"),
        (
            ["TIMESTAMP,Context,GeneratedTokens", "2023-11-16 18:15:46.6805900,1,2"],
            "missing column(s) ContextTokens (found: 'TIMESTAMP', 'Context', 'GeneratedTokens')",
        ),
        ([HEADER], "header but no rows"),
        ([HEADER, "2023-11-16 18:15:46.6805900,1"], "not a well-formed CSV"),
        ([HEADER, "2023-11-16 18:15:46.6805900,1,99999999999"], "between 0 and 2147483647"),
        ([HEADER + ",GeneratedTokens", "2023-11-16 18:15:46.6805900,1,2,3"], "GeneratedTokens appear more than once"),
    ],
    ids=["timestamp", "tokens-text", "negative", "empty-cell", "column", "header-only", "ragged", "overflow", "twice"],
)
def test_malformed_azure_csv_is_one_clear_user_error(tmp_path, lines, expected):
    src = write_lines(tmp_path / "bad.csv", lines)
    with pytest.raises(UserError) as caught:
        import_trace("azure", src)
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)


def test_missing_empty_directory_and_binary_sources_are_user_errors(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.touch()
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00TIMESTAMP\x00\n\x81\x82")
    for src, expected in [
        (tmp_path / "nope.csv", "no such file"),
        (empty, "the file is empty"),
        (tmp_path, "is a directory"),
        (binary, "not a UTF-8"),
    ]:
        with pytest.raises(UserError, match=expected):
            import_trace("azure", src)
