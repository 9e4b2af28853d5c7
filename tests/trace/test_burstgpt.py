"""BurstGPT importer: the shipped v1.1 slice, v1.2 columns, failed rows and malformed files."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from harness.errors import UserError
from harness.trace.importers import import_trace
from harness.trace.outcome import FAILED_FINISH_REASON, failed_mask
from tests.trace.support import BURSTGPT, write_lines

V12_HEADER = "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type"


def test_real_slice_keeps_failed_rows_marked_and_counted():
    with BURSTGPT.open() as handle:
        rows = list(csv.DictReader(handle))
    zero_response = sum(int(r["Response tokens"]) == 0 for r in rows)
    result = import_trace("burstgpt", BURSTGPT)
    table = result.trace.table
    assert len(result.trace) == len(rows) == 400
    assert result.failed_rows == zero_response == 17
    assert any("17 failed request(s)" in note for note in result.notes)
    failed = failed_mask(table)
    assert failed.sum() == 17
    assert (table.column("output_tokens").to_numpy()[failed] == 0).all()
    assert set(table.column("finish_reason").to_pylist()) == {None, FAILED_FINISH_REASON}
    assert int(table.column("prompt_tokens").to_numpy().sum()) == sum(int(r["Request tokens"]) for r in rows)
    assert set(table.column("model").to_pylist()) == {"ChatGPT", "GPT-4"}
    assert set(table.column("tenant").to_pylist()) == {"Conversation log", "API log"}
    arrivals = result.trace.arrivals.to_numpy()
    assert arrivals[0] == 0 and (np.diff(arrivals) >= 0).all()
    # Timestamp 5 -> 45 in the source: 40 s apart
    assert arrivals[1] == 40.0
    assert table.column("request_id")[0].as_py() == "burstgpt-1-first400-000000"


def test_v12_columns_fill_session_and_elapsed_time(tmp_path):
    src = write_lines(
        tmp_path / "BurstGPT_v1.2.csv",
        [
            V12_HEADER,
            "100,sess-a,3.5,ChatGPT,10,20,30,Conversation log",
            "101.25,sess-a,,GPT-4,11,0,11,API log",
            "103,sess-b,1.25,ChatGPT,12,22,34,Conversation log",
        ],
    )
    result = import_trace("burstgpt", src)
    table = result.trace.table
    assert table.column("session_id").to_pylist() == ["sess-a", "sess-a", "sess-b"]
    assert table.column("e2e_s").to_pylist() == [3.5, None, 1.25]
    assert result.trace.arrivals.to_pylist() == [0.0, 1.25, 3.0]
    assert result.failed_rows == 1
    assert "v1.2" in result.notes[0]


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (["Timestamp,Model,Request tokens,Response tokens", "abc,ChatGPT,1,2"], "Timestamp has 'abc' at data row 1"),
        (["Timestamp,Model,Request tokens", "1,ChatGPT,1"], "missing column(s) Response tokens"),
        (["Timestamp,Model,Request tokens,Response tokens", "1,ChatGPT,1.5,2"], "Request tokens has '1.5'"),
        (["Timestamp,Model,Request tokens,Response tokens", "inf,ChatGPT,1,2"], "not finite"),
        ([V12_HEADER, "1,s,slow,ChatGPT,1,2,3,API log"], "Elapsed time has 'slow'"),
        ([V12_HEADER, "1,s,-4,ChatGPT,1,2,3,API log"], "e2e_s row 0 is -4.0"),
    ],
    ids=["timestamp", "column", "fractional-tokens", "infinite-time", "elapsed", "negative-elapsed"],
)
def test_malformed_burstgpt_is_one_clear_user_error(tmp_path, lines, expected):
    with pytest.raises(UserError) as caught:
        import_trace("burstgpt", write_lines(tmp_path / "b.csv", lines))
    assert expected in str(caught.value)
