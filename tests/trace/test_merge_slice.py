"""`replaybench merge` and `slice`, and the shared --start/--duration/--limit options of `simulate`.

Recorder parts are written with the recorder's own `rows_to_trace` and file naming, so the merge is tested
against exactly the `clock` metadata a recording produces.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from harness.errors import UserError
from harness.record.naming import PartNaming
from harness.record.parts import rows_to_trace
from harness.record.row import RecordedRow
from harness.records.result_io import read_results
from harness.trace.merge import Part, merge_parts
from harness.trace.model import Trace
from tests.trace.support import replaybench
from tests.trace.test_cli import assert_one_line_error

STARTED = dt.datetime(2026, 11, 30, 9, 0, 0, tzinfo=dt.UTC)


def recorder_part(
    path: Path,
    run_id: str,
    arrivals: list[float],
    started: dt.datetime = STARTED,
    redaction: str = "hash",
    **extra: str,
) -> Path:
    """A part as the recorder writes it: rows count from the recorder start, then re-based to the first arrival."""
    rows = [
        RecordedRow(
            request_id=f"{run_id}-{i:08d}",
            arrival_s=arrival,
            api="completions",
            prompt_tokens=10 + i,
            output_tokens=5,
            params="{}",
        )
        for i, arrival in enumerate(arrivals)
    ]
    meta = {
        "source": "replaybench record",
        "clock": started.isoformat(timespec="microseconds"),
        "redaction": redaction,
    } | extra
    rows_to_trace(rows, meta).write(path)
    return path


def plain_trace(path: Path, ids: list[str], arrivals: list[float], **metadata: str) -> Path:
    columns = {
        "request_id": ids,
        "arrival_s": arrivals,
        "api": ["chat"] * len(ids),
        "prompt_tokens": [3] * len(ids),
        "output_tokens": [2] * len(ids),
        "params": ["{}"] * len(ids),
    }
    Trace.from_columns(columns, {"redaction": "drop"} | metadata).write(path)
    return path


def refused_then_merged(parts: list[Path], flag: str, *fragments: str) -> Trace:
    """`merge PARTS` fails in one line naming `fragments` and writes nothing; `merge PARTS flag` succeeds."""
    out = parts[0].parent / "merged.parquet"
    assert_one_line_error(replaybench("merge", *parts, "-o", out), *fragments)
    assert not out.exists()
    result = replaybench("merge", *parts, flag, "-o", out)
    assert result.returncode == 0, result.stderr
    return Trace.read(out)


def test_worker_parts_merge_in_absolute_arrival_order(tmp_path: Path) -> None:
    naming = PartNaming.from_output(tmp_path / "prod.parquet")
    w1 = recorder_part(naming.for_worker(1).part(1), "w1", [0.5, 2.0, 3.5])
    w2 = recorder_part(naming.for_worker(2).part(1), "w2", [1.0, 2.5], started=STARTED + dt.timedelta(seconds=0.25))
    assert Trace.read(w2).metadata["clock"] != Trace.read(w1).metadata["clock"]
    out = tmp_path / "merged.parquet"
    result = replaybench("merge", w2, w1, "-o", out)  # given out of order: the clock decides
    assert result.returncode == 0, result.stderr
    assert "merged 5 requests" in result.stdout and "2 part(s) placed by absolute arrival time" in result.stdout
    merged = Trace.read(out)
    assert merged.table.column("request_id").to_pylist() == [
        "w1-00000000",
        "w2-00000000",
        "w1-00000001",
        "w2-00000001",
        "w1-00000002",
    ]
    assert merged.arrivals.to_pylist() == pytest.approx([0.0, 0.75, 1.5, 2.25, 3.0])
    assert dt.datetime.fromisoformat(merged.metadata["clock"]) == STARTED + dt.timedelta(seconds=0.5)
    assert merged.metadata["redaction"] == "hash"
    assert merged.metadata["source"] == f"{w2}, {w1}"
    assert merged.metadata["replaybench.merge.mode"] == "clock"
    assert json.loads(merged.metadata["replaybench.merge.part_sources"]) == ["replaybench record"] * 2
    for key in ("replaybench.record.offset_s", "replaybench.record.started_at"):
        assert key not in merged.metadata  # they differ between the parts: any one would be wrong for the whole


def test_rotated_parts_merge_from_a_directory_or_a_quoted_glob(tmp_path: Path) -> None:
    naming = PartNaming.from_output(tmp_path / "prod.parquet")
    recorder_part(naming.part(2), "r", [60.0, 61.0])  # rotation: the same recorder start, later rows
    recorder_part(naming.part(1), "q", [0.2, 30.0])
    out = tmp_path / "prod.parquet"  # inside the directory and matching the glob: never read as a part
    for source in (tmp_path, str(tmp_path / "prod-*.parquet")):
        result = replaybench("merge", source, "-o", out)
        assert result.returncode == 0, result.stderr
        merged = Trace.read(out)
        assert merged.arrivals.to_pylist() == pytest.approx([0.0, 29.8, 59.8, 60.8])
        assert merged.table.column("request_id").to_pylist()[2:] == ["r-00000000", "r-00000001"]
        assert merged.metadata["replaybench.record.started_at"] == STARTED.isoformat(timespec="microseconds")


def test_concat_appends_parts_without_a_clock_in_the_given_order(tmp_path: Path) -> None:
    a = plain_trace(tmp_path / "a.parquet", ["a1", "a2"], [0.0, 4.0], clock="12 s after 00:00 of the first day")
    b = plain_trace(tmp_path / "b.parquet", ["b1", "b2", "b3"], [0.0, 1.0, 2.0], clock="3 s on the source's clock")
    merged = refused_then_merged([b, a], "--concat", "b.parquet", "no absolute clock", "--concat")
    assert merged.table.column("request_id").to_pylist() == ["b1", "b2", "b3", "a1", "a2"]
    assert merged.arrivals.to_pylist() == [0.0, 1.0, 2.0, 2.0, 6.0]
    assert merged.metadata["replaybench.merge.mode"] == "concat"
    assert merged.metadata["clock"] == "3 s on the source's clock"  # the first part's


def test_redaction_mismatch_is_refused_in_one_line(tmp_path: Path) -> None:
    hashed = recorder_part(tmp_path / "h.parquet", "h", [0.0, 1.0], redaction="hash")
    plain = recorder_part(tmp_path / "p.parquet", "p", [0.5], redaction="none")
    out = tmp_path / "out.parquet"
    result = replaybench("merge", hashed, plain, "-o", out)
    assert_one_line_error(result, "disagree on redaction", "h.parquet=hash", "p.parquet=none")
    assert not out.exists()


def test_id_collisions_are_refused_unless_ids_are_prefixed(tmp_path: Path) -> None:
    a = recorder_part(tmp_path / "prod-0001.parquet", "run", [0.0, 1.0])
    b = recorder_part(tmp_path / "prod-0002.parquet", "run", [0.5], started=STARTED + dt.timedelta(seconds=10))
    merged = refused_then_merged(
        [a, b], "--prefix-ids", "'run-00000000'", "prod-0001.parquet, prod-0002.parquet", "--prefix-ids"
    )
    assert merged.table.column("request_id").to_pylist() == [
        "prod-0001/run-00000000",
        "prod-0001/run-00000001",
        "prod-0002/run-00000000",
    ]


def test_prefixing_cannot_help_two_parts_with_one_file_name(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    parts = [
        Part(path, Trace.read(recorder_part(path, "same", [0.0])))
        for path in (tmp_path / "x" / "prod-0001.parquet", tmp_path / "y" / "prod-0001.parquet")
    ]
    with pytest.raises(UserError, match="two parts share a file name"):
        merge_parts(parts, prefix_ids=True)


def test_tokenizer_and_block_size_must_agree_when_present(tmp_path: Path) -> None:
    a = Part(
        tmp_path / "a.parquet",
        Trace.read(recorder_part(tmp_path / "a.parquet", "a", [0.0], block_size="16", tokenizer="tok")),
    )
    b = Part(tmp_path / "b.parquet", Trace.read(recorder_part(tmp_path / "b.parquet", "b", [0.0])))
    c = Part(
        tmp_path / "c.parquet",
        Trace.read(recorder_part(tmp_path / "c.parquet", "c", [0.0], block_size="32", tokenizer="tok")),
    )
    merged = merge_parts([a, b])
    assert (merged.metadata["block_size"], merged.metadata["tokenizer"]) == ("16", "tok")
    with pytest.raises(UserError, match=r"disagree on block_size \(a.parquet=16, c.parquet=32\)"):
        merge_parts([a, c])


def test_mixed_zone_and_zoneless_clocks_are_refused(tmp_path: Path) -> None:
    aware = Part(tmp_path / "a.parquet", Trace.read(recorder_part(tmp_path / "a.parquet", "a", [0.0])))
    naive = Part(
        tmp_path / "n.parquet",
        Trace.read(recorder_part(tmp_path / "n.parquet", "n", [0.0], started=STARTED.replace(tzinfo=None))),
    )
    with pytest.raises(UserError, match=r"n\.parquet: its clock has no UTC offset"):
        merge_parts([aware, naive])
    assert len(merge_parts([aware, naive], concat=True)) == 2


def test_merge_refuses_to_overwrite_a_named_part(tmp_path: Path) -> None:
    a = recorder_part(tmp_path / "a.parquet", "a", [0.0, 1.0])
    before = a.read_bytes()
    assert_one_line_error(replaybench("merge", a, "-o", a), "would overwrite this part")
    assert a.read_bytes() == before


def test_slice_cuts_and_compresses_a_trace(tmp_path: Path) -> None:
    src = plain_trace(tmp_path / "t.parquet", [f"r{i}" for i in range(6)], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    out = tmp_path / "cut.parquet"
    result = replaybench("slice", src, "-o", out, "--start", "1", "--duration", "3", "--time-scale", "0.5")
    assert result.returncode == 0, result.stderr
    assert "kept 3 of 6 requests" in result.stdout
    cut = Trace.read(out)
    assert cut.table.column("request_id").to_pylist() == ["r1", "r2", "r3"]
    assert cut.arrivals.to_pylist() == [0.0, 0.5, 1.0]
    assert cut.metadata["slice"] == "start=1.0 duration=3.0 limit=None time_scale=0.5"
    assert replaybench("slice", src, "-o", out, "--limit", "2").returncode == 0
    assert Trace.read(out).table.column("request_id").to_pylist() == ["r0", "r1"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--start", "-1"), "--start must be >= 0"),
        (("--duration", "0"), "--duration > 0"),
        (("--limit", "0"), "--limit must be at least 1"),
        (("--time-scale", "0"), "--time-scale must be > 0"),
        (("--start", "100"), "holds no requests"),
    ],
)
def test_slice_rejects_bad_options_in_one_line(tmp_path: Path, args: tuple[str, ...], fragment: str) -> None:
    src = plain_trace(tmp_path / "t.parquet", ["a", "b"], [0.0, 1.0])
    out = tmp_path / "cut.parquet"
    assert_one_line_error(replaybench("slice", src, "-o", out, *args), fragment)
    assert not out.exists()


def test_slice_refuses_to_overwrite_its_input(tmp_path: Path) -> None:
    src = plain_trace(tmp_path / "t.parquet", ["a", "b"], [0.0, 1.0])
    assert_one_line_error(replaybench("slice", src, "-o", src, "--limit", "1"), "would overwrite the trace")
    assert len(Trace.read(src)) == 2


def test_simulate_honours_start_and_limit(tmp_path: Path) -> None:
    src = plain_trace(tmp_path / "t.parquet", [f"r{i}" for i in range(8)], [0.1 * i for i in range(8)])
    out = tmp_path / "sim.parquet"
    result = replaybench("simulate", src, "-o", out, "--start", "0.2", "--limit", "3")
    assert result.returncode == 0, result.stderr
    table, _ = read_results(out)
    assert sorted(table.column("request_id").to_pylist()) == ["r2", "r3", "r4"]
