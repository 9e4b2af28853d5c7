"""Every recorded field of a replay against the real test upstream: success, faults, both APIs, both modes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.errors import UserError
from harness.records.result_schema import (
    META_ARM,
    META_COMPLETE,
    META_REPEAT,
    META_REQUEST_ID_PREFIX,
    META_URL,
    RESULT_SCHEMA,
)
from harness.replay.result_row import ResultRow
from tests.replay.support import free_port_without_listener, make_trace, replay
from tests.support.openai_server import upstream


def check_timing(row: dict, index: int, gap_s: float = 0.02) -> None:
    assert row["intended_s"] == pytest.approx(index * gap_s)
    assert row["sent_s"] >= row["intended_s"]  # never early
    assert row["lag_s"] == pytest.approx(row["sent_s"] - row["intended_s"])


def check_stream(row: dict, tokens: int) -> None:
    times = row["token_times"]
    assert len(times) == tokens == row["output_tokens"]
    assert times == sorted(times)
    assert row["ttft_s"] == pytest.approx(times[0], rel=1e-6)
    assert row["e2e_s"] >= row["ttft_s"] > 0


def test_result_row_has_exactly_the_result_columns() -> None:
    assert list(ResultRow.__dataclass_fields__) != []
    assert set(ResultRow.__dataclass_fields__) == set(RESULT_SCHEMA.names)


def test_streamed_completions_record_every_field(ok_url: str, tmp_path: Path) -> None:
    trace = make_trace(n=6, prompt_tokens=12, output_tokens=4, tenant=["api", "chat", None] * 2)
    outcome, table, meta = replay(trace, ok_url, tmp_path / "r.parquet")
    assert (outcome.complete, outcome.interrupted, outcome.requests, outcome.scheduled) == (True, False, 6, 6)
    assert outcome.errors == {}
    assert (meta[META_COMPLETE], meta[META_ARM], meta[META_REPEAT], meta[META_URL]) == ("true", "a", "3", ok_url)
    rows = table.to_pylist()
    assert [r["request_id"] for r in rows] == [f"req-{i}" for i in range(6)]
    for i, row in enumerate(rows):
        check_timing(row, i)
        check_stream(row, 4)
        assert (row["arm"], row["repeat"], row["status"], row["error"], row["worker"]) == ("a", 3, 200, None, 0)
        assert (row["output_tokens_usage"], row["expected_output_tokens"]) == (4, 4)
        assert (row["prompt_tokens"], row["prompt_tokens_server"]) == (12, 12)
        assert (row["finish_reason"], row["output_text"]) == ("length", None)
        assert row["tenant"] == ["api", "chat", None][i % 3]  # the trace's, for per-tenant segments
    assert outcome.fidelity.output_mismatches == 0
    assert outcome.fidelity.sent == 6


def test_streamed_chat_fits_the_template_and_keeps_text(ok_url: str, tmp_path: Path) -> None:
    trace = make_trace(n=3, api="chat", prompt_tokens=15, output_tokens=5)
    outcome, table, _ = replay(trace, ok_url, tmp_path / "r.parquet", save_outputs=True)
    assert outcome.errors == {}
    for i, row in enumerate(table.to_pylist()):
        check_timing(row, i)
        check_stream(row, 5)  # the role-only first chunk is not a token
        assert row["prompt_tokens_server"] == 15  # 13 words + 2 template tokens, found through /tokenize
        assert row["output_text"] == " t0 t1 t2 t3 t4"
        assert (row["output_tokens_usage"], row["finish_reason"]) == (5, "length")


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_non_streaming_records_usage_and_e2e_only(ok_url: str, tmp_path: Path, api: str) -> None:
    outcome, table, _ = replay(
        make_trace(n=2, api=api, output_tokens=3), ok_url, tmp_path / "r.parquet", stream=False, save_outputs=True
    )
    assert outcome.errors == {}
    for row in table.to_pylist():
        assert (row["status"], row["error"], row["finish_reason"]) == (200, None, "length")
        assert (row["ttft_s"], row["token_times"], row["output_tokens"]) == (None, None, 3)  # the server's count
        assert row["token_count_source"] == "final_usage"
        assert row["output_tokens_usage"] == 3 and row["prompt_tokens_server"] == 12
        assert row["e2e_s"] > 0 and row["output_text"] == " t0 t1 t2"
    assert outcome.fidelity.output_mismatches == 0


def test_stalled_stream_times_out_and_keeps_what_arrived(tmp_path: Path) -> None:
    with upstream("stall", fault_after=2) as url:
        outcome, table, _ = replay(make_trace(n=2, output_tokens=6), url, tmp_path / "r.parquet", read_timeout_s=0.3)
    assert outcome.errors == {"timeout": 2}
    for row in table.to_pylist():
        assert (row["status"], row["error"], row["finish_reason"]) == (200, "timeout", None)
        check_stream(row, 2)
        assert row["e2e_s"] >= 0.3 and row["output_tokens_usage"] == 2  # the last cumulative usage seen
    assert outcome.fidelity.output_mismatches == 0  # failed requests are not length mismatches


def test_dropped_stream_is_a_broken_stream(tmp_path: Path) -> None:
    with upstream("drop", fault_after=3) as url:
        outcome, table, _ = replay(make_trace(n=2, output_tokens=6), url, tmp_path / "r.parquet")
    assert outcome.errors == {"broken_stream": 2}
    for row in table.to_pylist():
        assert (row["status"], row["error"]) == (200, "broken_stream")
        check_stream(row, 3)


@pytest.mark.parametrize(("mode", "error"), [("429", "http_429"), ("500", "http_5xx")])
def test_http_errors_are_classified(tmp_path: Path, mode: str, error: str) -> None:
    with upstream(mode, fault_every=2) as url:  # requests 0 and 2 fail, 1 and 3 succeed
        outcome, table, _ = replay(make_trace(n=4, gap_s=0.05), url, tmp_path / "r.parquet")
    assert outcome.errors == {error: 2}
    rows = table.to_pylist()
    for row in rows[0::2]:
        assert (row["status"], row["error"], row["output_tokens"], row["ttft_s"]) == (int(mode), error, 0, None)
    for row in rows[1::2]:
        assert (row["status"], row["error"], row["output_tokens"]) == (200, None, 4)


def test_slow_first_token_shows_in_ttft(tmp_path: Path) -> None:
    with upstream("slow-first", first_token_delay=0.3) as url:
        _, table, _ = replay(make_trace(n=1), url, tmp_path / "r.parquet")
    row = table.to_pylist()[0]
    assert row["error"] is None and row["ttft_s"] >= 0.3
    assert row["token_times"][-1] - row["token_times"][0] < row["ttft_s"]


def test_unreachable_server_is_one_clear_error(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port_without_listener()}"
    with pytest.raises(UserError, match="cannot reach the server"):
        replay(make_trace(n=1), url, tmp_path / "r.parquet")
    assert not (tmp_path / "r.parquet").exists() and not (tmp_path / "r.parquet.partial").exists()


def test_refused_connection_is_classified_connect() -> None:
    import asyncio

    import aiohttp

    from harness.replay.client import ClientSettings, send
    from harness.replay.payloads import PreparedRequest

    settings = ClientSettings(
        url=f"http://127.0.0.1:{free_port_without_listener()}",
        arm="a",
        repeat=0,
        worker=0,
        t0=0.0,
        stream=True,
        keep_text=False,
        headers={},
        timeout=aiohttp.ClientTimeout(total=5),
        request_id_prefix="rb-a-r0-00000000-",
    )
    request = PreparedRequest(
        index=0,
        request_id="r",
        intended_s=0.0,
        path="/v1/completions",
        body=b"{}",
        prompt_tokens=1,
        expected_output_tokens=1,
    )

    async def send_once() -> ResultRow:
        async with aiohttp.ClientSession() as session:
            return await send(session, request, settings)

    row = asyncio.run(send_once())
    assert (row.error, row.status, row.output_tokens, row.sent_s is not None) == ("connect", None, 0, True)


def test_model_name_follows_the_server_unless_given(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    with upstream("ok", log=log) as url:
        replay(make_trace(n=1, model=["not-served"]), url, tmp_path / "a.parquet")
        replay(make_trace(n=1), url, tmp_path / "b.parquet", model="forced")
    bodies = [json.loads(line)["body"] for line in log.read_text().splitlines()]
    assert [json.loads(b)["model"] for b in bodies] == ["test-model", "forced"]


def test_every_request_carries_a_run_unique_x_request_id_the_server_can_log(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    ids = ["plain-0", "with space 1", "é/2", "tab\t3"]  # a trace's ids need not be valid header text
    with upstream("ok", log=log) as url:
        _, first, meta_1 = replay(make_trace(n=4, request_id=ids), url, tmp_path / "a.parquet", workers=2)
        _, _, meta_2 = replay(make_trace(n=4, request_id=ids), url, tmp_path / "b.parquet")
    prefixes = [meta[META_REQUEST_ID_PREFIX] for meta in (meta_1, meta_2)]
    assert all(re.fullmatch(r"rb-a-r3-[0-9a-f]{8}-", prefix) for prefix in prefixes)
    assert prefixes[0] != prefixes[1]  # the same trace again on a server still up: no id repeats
    seen = [json.loads(line)["request_id"] for line in log.read_text().splitlines()]
    quoted = ["plain-0", "with%20space%201", "%C3%A9%2F2", "tab%093"]
    assert sorted(seen) == sorted(prefix + q for prefix in prefixes for q in quoted)
    assert first.column("error").null_count == 4  # every id, however odd, made a valid request
