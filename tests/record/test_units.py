"""Pure pieces of the recorder: option parsing, credential detection, file naming, segment reading, hashing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import UserError
from harness.record.naming import PartNaming, part_for_segment
from harness.record.options import (
    auto_workers,
    check_header_name,
    parse_duration,
    parse_listen,
    parse_size,
    parse_upstream,
    parse_workers,
)
from harness.record.row import RecordedRow
from harness.record.secrets import REDACTED, is_secret_name, scrub, scrub_text
from harness.record.segment import SegmentWriter, read_segment
from harness.record.tokens import fallback_tokens, prefix_block_ids


@pytest.mark.parametrize(
    ("text", "size"),
    [("4MiB", 4 * 1024**2), ("512KiB", 512 * 1024), ("1000", 1000), ("1.5kb", 1500), ("2 GiB", 2 * 1024**3)],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(("text", "seconds"), [("15m", 900.0), ("1h", 3600.0), ("30s", 30.0), ("0", 0.0), ("2.5", 2.5)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["4 parsecs", "", "-1m", "MiB"])
def test_bad_quantities_are_one_line_user_errors(bad: str) -> None:
    with pytest.raises(UserError, match="write it like"):
        parse_size(bad)


@pytest.mark.parametrize(("cores", "workers"), [(1, 1), (2, 1), (7, 1), (8, 2), (15, 3), (16, 4), (128, 4)])
def test_auto_workers_scale_with_cores_up_to_four(cores: int, workers: int) -> None:
    assert auto_workers(cores) == workers
    assert parse_workers("auto", cores) == parse_workers("AUTO", cores) == workers


def test_explicit_workers_are_kept_whatever_the_cores() -> None:
    assert parse_workers("1", cores=16) == 1
    assert parse_workers("6", cores=2) == 6


def test_listen_loopback_only_unless_allowed() -> None:
    assert parse_listen("127.0.0.1:8080", allow_remote=False) == ("127.0.0.1", 8080)
    assert parse_listen("[::1]:0", allow_remote=False) == ("::1", 0)
    assert parse_listen("localhost:9", allow_remote=False) == ("localhost", 9)
    with pytest.raises(UserError, match="--allow-remote"):
        parse_listen("0.0.0.0:8080", allow_remote=False)
    assert parse_listen("0.0.0.0:8080", allow_remote=True) == ("0.0.0.0", 8080)
    with pytest.raises(UserError, match="HOST:PORT"):
        parse_listen("8080", allow_remote=False)


def test_upstream_must_be_http() -> None:
    assert str(parse_upstream("http://127.0.0.1:8000/")) == "http://127.0.0.1:8000"
    with pytest.raises(UserError, match="http"):
        parse_upstream("127.0.0.1:8000")


@pytest.mark.parametrize(
    "name",
    [
        "Authorization",
        "api-key",
        "X-API-Key",
        "Cookie",
        "set-cookie",
        "api_key",
        "openai_api_key",
        "access_token",
        "token",
        "client_secret",
        "password",
        "Proxy-Authorization",
        "x-amz-security-token",
        "Ocp-Apim-Subscription-Key",
    ],
)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "max_tokens",
        "prompt_tokens",
        "x-session-id",
        "x-tenant-id",
        "temperature",
        "top_logprobs",
        "author",
        "stream_options",
        "model",
        "user",
    ],
)
def test_ordinary_names(name: str) -> None:
    assert not is_secret_name(name)


def test_session_header_may_not_carry_credentials() -> None:
    assert check_header_name("X-Session-Id", "--session-header") == "x-session-id"
    with pytest.raises(UserError, match="credentials"):
        check_header_name("Authorization", "--session-header")


def test_scrub_removes_named_fields_and_shaped_values() -> None:
    key = "sk-proj-" + "A1b2C3d4" * 4
    body = {
        "temperature": 0.5,
        "api_key": key,
        "extra": {"Token": "x", "note": f"use {key} now"},
        "list": [f"Bearer {key}", 3],
    }
    cleaned = scrub(body)
    assert key not in json.dumps(cleaned)
    assert cleaned == {"temperature": 0.5, "extra": {"note": f"use {REDACTED} now"}, "list": [REDACTED, 3]}
    assert scrub_text("AKIAABCDEFGHIJKLMNOP and ghp_" + "x" * 36) == f"{REDACTED} and {REDACTED}"


def test_part_naming(tmp_path: Path) -> None:
    naming = PartNaming.from_output(tmp_path / "prod.parquet")
    assert naming.part(3) == tmp_path / "prod-0003.parquet"
    assert part_for_segment(naming.segment(3)) == naming.part(3)
    assert naming.next_index() == 1
    naming.part(1).write_bytes(b"x")
    naming.segment(4).write_bytes(b"x")
    (tmp_path / "other-0009.parquet").write_bytes(b"x")
    assert naming.next_index() == 5
    assert PartNaming.from_output(tmp_path).part(1) == tmp_path / "record-0001.parquet"


def _row(i: int) -> RecordedRow:
    return RecordedRow(
        request_id=f"r{i}", arrival_s=float(i), api="chat", prompt_tokens=i, output_tokens=1, params="{}"
    )


def test_segment_skips_and_counts_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "a-0001.segment.jsonl"
    writer = SegmentWriter(path, {"redaction": "drop"})
    for i in range(3):
        writer.append(_row(i))
    writer.sync()
    writer.close()
    with open(path, "ab") as handle:
        handle.write(_row(3).to_line()[:20])  # a crash in the middle of a line
    contents = read_segment(path)
    assert [r.request_id for r in contents.rows] == ["r0", "r1", "r2"]
    assert contents.bad_lines == 1 and contents.metadata == {"redaction": "drop"}


def test_a_failed_write_never_glues_onto_the_next_line(tmp_path: Path) -> None:
    path = tmp_path / "a-0001.segment.jsonl"
    writer = SegmentWriter(path, {})
    writer.append(_row(0))
    with open(path, "ab") as handle:  # what a short write (disk full) leaves behind
        handle.write(b'{"request_id": "half')
    writer._torn = True  # the writer saw that write fail part-way
    writer.append(_row(1))
    writer.close()
    contents = read_segment(path)
    assert [r.request_id for r in contents.rows] == ["r0", "r1"] and contents.bad_lines == 1


def test_block_ids_share_exactly_the_common_full_blocks() -> None:
    key = b"k" * 32
    a = prefix_block_ids(list(range(40)), 16, key)
    b = prefix_block_ids(list(range(32)) + [99] * 8, 16, key)
    c = prefix_block_ids([7, *range(1, 40)], 16, key)
    assert len(a) == 2 and a == b  # only full blocks; the differing tail is in no full block
    assert c[0] != a[0] and c[1] != a[1]  # chained: a different first block changes every later id
    assert prefix_block_ids(list(range(40)), 16, b"other" * 7) != a  # keyed


def test_fallback_tokens() -> None:
    assert fallback_tokens({"prompt": [1, 2, 3]}) == [1, 2, 3]
    assert len(fallback_tokens({"prompt": "a b  c"})) == 3
    chat = fallback_tokens({"messages": [{"role": "user", "content": [{"type": "text", "text": "x y"}]}]})
    assert len(chat) == 3  # role + two words


def test_tokenizer_falls_back_when_the_upstream_cannot_tokenize() -> None:
    import asyncio
    import socket

    import aiohttp
    from yarl import URL

    from harness.record.tokens import FALLBACK_TOKENIZER, Tokenizer

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = URL(f"http://127.0.0.1:{sock.getsockname()[1]}")

    async def probe() -> Tokenizer:
        async with aiohttp.ClientSession() as session:
            return await Tokenizer.probe(session, dead)

    tokenizer = asyncio.run(probe())
    assert tokenizer.name == FALLBACK_TOKENIZER and not tokenizer.upstream
    assert asyncio.run(tokenizer.tokens({"prompt": "a b c"})) == fallback_tokens({"prompt": "a b c"})


def test_a_part_whose_segment_stays_locked_at_shutdown_is_kept_and_said(tmp_path: Path) -> None:
    """Seen under CPU load: the last part's segment was left unconverted and the recorder said nothing. Another
    descriptor still holding the segment's lock stands in for whatever held it then."""
    import asyncio
    import os

    from harness.record.recording import Recording
    from harness.record.stats import RecorderStats

    said: list[str] = []
    stats = RecorderStats()
    recording = Recording(PartNaming.from_output(tmp_path / "prod.parquet"), {}, stats, said.append)
    recording.open()
    segment = recording.segment
    assert segment is not None
    holder = os.dup(recording._writer._fd)  # shares the open file description, so the flock outlives close()
    try:
        asyncio.run(recording.close())
    finally:
        os.close(holder)
    assert segment.exists() and stats.segments_kept == [segment]
    assert len(said) == 1 and "its lock was still held" in said[0] and f"--recover {tmp_path}" in said[0]
    assert any("kept segment" in line for line in stats.summary_lines())


def test_shutdown_during_a_rotation_still_converts_the_rotated_part(tmp_path: Path) -> None:
    """Seen under CPU load: shutdown cancelled the rotation loop while it was finishing the part it had just
    closed, so that part stayed a segment and the recorder said 'incidents: none'."""
    import asyncio
    import datetime as dt

    from harness.record.recording import Recording
    from harness.record.stats import RecorderStats
    from harness.records.trace_schema import META_CLOCK

    async def record_rotate_and_stop(recording: Recording) -> None:
        recording.open()
        for i in range(3):
            recording.append(_row(i))
        rotation = asyncio.create_task(recording.rotate())
        await asyncio.sleep(0)  # the rotation has opened the next part and is finishing the first
        recording.append(_row(3))
        rotation.cancel()  # what shutdown does to the rotation loop
        await asyncio.gather(rotation, return_exceptions=True)
        await recording.close()

    stats, said = RecorderStats(), []
    started = {META_CLOCK: dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")}
    naming = PartNaming.from_output(tmp_path / "prod.parquet")
    asyncio.run(record_rotate_and_stop(Recording(naming, started, stats, said.append)))
    assert not list(tmp_path.glob("*.segment.jsonl")) and said == [] and not stats.segments_kept
    assert [p.name for p in stats.parts] == ["prod-0001.parquet", "prod-0002.parquet"] and stats.rows_in_parts == 4


def test_a_converter_worker_that_dies_is_replaced_and_the_part_still_written(tmp_path: Path) -> None:
    """Seen once under a parallel test suite on a small machine: the Parquet worker process was killed, the pool
    broke, and the recorder kept the segment and exited 1. A killed worker stands in for it: the next rotation's
    part is written by a fresh worker, and nothing is kept or said."""
    import asyncio
    import datetime as dt
    import multiprocessing

    from harness.record.recording import Recording
    from harness.record.stats import RecorderStats
    from harness.records.trace_schema import META_CLOCK

    async def rotate_twice_killing_the_worker_between(recording: Recording) -> None:
        recording.open()
        recording.append(_row(0))
        others = set(multiprocessing.active_children())
        await recording.rotate()  # starts the worker, which writes part 1
        workers = set(multiprocessing.active_children()) - others
        assert workers
        for worker in workers:
            worker.kill()
            worker.join()
        recording.append(_row(1))
        await recording.rotate()  # the pool is broken now: part 2 needs a fresh worker
        await recording.close()

    stats, said = RecorderStats(), []
    started = {META_CLOCK: dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")}
    naming = PartNaming.from_output(tmp_path / "prod.parquet")
    asyncio.run(rotate_twice_killing_the_worker_between(Recording(naming, started, stats, said.append)))
    assert said == [] and not stats.segments_kept and not list(tmp_path.glob("*.segment.jsonl"))
    assert [p.name for p in stats.parts] == ["prod-0001.parquet", "prod-0002.parquet"] and stats.rows_in_parts == 2
