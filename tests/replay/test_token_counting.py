"""Tokens are counted by the server, not by text: multi-token chunks, empty-text chunks, TPOT and ITL at pace."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.analysis.run_metrics import TimeBlocks, load_run
from harness.records.decision_config import CostConfig, DecisionConfig, SloConfig
from harness.replay.result_row import ResultRow
from harness.replay.stream_parse import StreamReader
from tests.replay.support import make_trace, replay
from tests.support.openai_server import upstream

PACE_S = 0.02  # the test upstream's per-token delay (long against the loop's own overhead)
CHUNKS = (1, 3, 2, 4)  # tokens per chunk, cycled; every third chunk has empty text


def _row() -> ResultRow:
    return ResultRow("r", "a", 0, 0.0, 0, prompt_tokens=4, expected_output_tokens=7)


def _read(events: list[dict], times: list[float]) -> ResultRow:
    row = _row()
    reader = StreamReader(row, keep_text=True)
    for event, at in zip(events, times, strict=True):
        reader.feed(b"data: " + json.dumps(event).encode(), at)
    reader.feed(b"data: [DONE]", times[-1])
    reader.finish()
    return row


def _chunk(text: str, done: int | None = None, finish: str | None = None) -> dict:
    usage = {} if done is None else {"usage": {"prompt_tokens": 4, "completion_tokens": done}}
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish}]} | usage


def test_continuous_usage_counts_multi_token_and_empty_text_chunks() -> None:
    events = [_chunk(" a", 1), _chunk("", 3), _chunk(" b c", 6), _chunk("", 7, "length")]
    events.append({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 7}})
    row = _read(events, [0.1, 0.2, 0.3, 0.4, 0.41])
    assert row.token_times == [0.1, 0.2, 0.3, 0.4]  # the usage-only chunk carries no token
    assert row.token_counts == [1, 2, 3, 1]
    assert (row.output_tokens, row.output_tokens_usage, row.token_count_source) == (7, 7, "continuous_usage")
    assert (row.ttft_s, row.output_text, row.finish_reason) == (0.1, " a b c", "length")


def test_final_usage_only_counts_empty_text_chunks_and_takes_the_servers_total() -> None:
    events = [_chunk(" a"), _chunk(""), _chunk(" b"), _chunk("", finish="length")]
    events.append({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 4}})
    row = _read(events, [0.1, 0.2, 0.3, 0.4, 0.41])
    assert row.token_times == [0.1, 0.2, 0.3, 0.4]  # the empty last chunk is the 4th token the usage names
    assert (row.output_tokens, row.token_count_source) == (4, "final_usage")


def test_an_empty_closing_chunk_is_not_a_token_when_the_usage_is_complete() -> None:
    events = [_chunk(" a"), _chunk(" b"), _chunk("", finish="length")]
    events.append({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}})
    row = _read(events, [0.1, 0.2, 0.3, 0.31])
    assert (row.token_times, row.output_tokens) == ([0.1, 0.2], 2)


def test_without_any_usage_chunks_are_counted_and_chat_openers_are_not() -> None:
    opener = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    token = {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": None}]}
    last = {"choices": [{"index": 0, "delta": {"content": " x"}, "finish_reason": "stop"}]}
    row = _read([opener, token, last], [0.05, 0.1, 0.2])
    assert (row.token_times, row.token_counts, row.output_tokens) == ([0.1, 0.2], [1, 1], 2)
    assert (row.token_count_source, row.ttft_s) == ("chunks", 0.1)


def _metrics(path: Path) -> dict[str, float]:
    run = load_run(path, TimeBlocks(0.0, 10.0, 1), SloConfig(), DecisionConfig(), CostConfig())
    return run.metrics | {"_sources": run.token_count_sources}


@pytest.fixture(scope="module")
def paced_url() -> str:
    with upstream(token_delay=PACE_S, chunk_tokens=CHUNKS, empty_every=3) as url:
        yield url


@pytest.mark.timing
def test_replay_measures_the_per_token_pace_of_multi_token_chunks(paced_url: str, tmp_path: Path) -> None:
    outcome, table, _ = replay(make_trace(n=6, gap_s=0.05, output_tokens=31), paced_url, tmp_path / "r.parquet")
    assert outcome.errors == {} and outcome.fidelity.output_mismatches == 0
    for row in table.to_pylist():
        assert row["output_tokens"] == row["output_tokens_usage"] == 31 == sum(row["token_counts"])
        assert row["token_counts"][:5] == [1, 3, 2, 4, 1] and row["token_count_source"] == "continuous_usage"
    metrics = _metrics(outcome.path)
    assert metrics["tpot_p50"] == pytest.approx(PACE_S, rel=0.05)
    assert metrics["itl_p50"] == pytest.approx(PACE_S, rel=0.05)
    assert metrics["icl_p90"] == pytest.approx(4 * PACE_S, rel=0.1)  # a 4-token chunk waits 4 token delays
    assert metrics["_sources"] == {"continuous_usage": 6}


@pytest.mark.timing
def test_final_usage_still_gives_the_per_token_tpot(paced_url: str, tmp_path: Path) -> None:
    trace = make_trace(n=4, gap_s=0.05, output_tokens=31)
    outcome, table, _ = replay(trace, paced_url, tmp_path / "r.parquet", usage_per_chunk=False)
    counted = [len(t) for t in table.column("token_times").to_pylist()]
    assert np.unique(counted).tolist() == [13]  # 31 tokens in chunks of 1, 3, 2, 4: 13 chunks, 4 of them empty
    assert table.column("output_tokens").to_pylist() == [31] * 4
    metrics = _metrics(outcome.path)
    assert metrics["tpot_p50"] == pytest.approx(PACE_S, rel=0.05)
    assert metrics["_sources"] == {"final_usage": 4}
