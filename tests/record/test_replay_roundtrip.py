"""A recorded trace replays (`replaybench replay`) with the recorded lengths and relative timing."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp

from harness.records.result_io import read_results
from harness.trace.model import Trace
from tests.record.recorder_process import recorder, run_cli
from tests.record.traffic import chat_body, completion_body, encode
from tests.support.openai_server import read_log, upstream

# (offset s, api, output tokens); sent at these offsets from the first request
SCHEDULE = [
    (0.0, "chat", 5),
    (0.3, "completions", 3),
    (0.35, "chat", 12),
    (0.9, "completions", 1),
    (1.4, "chat", 7),
    (1.45, "completions", 9),
]
TIMING_TOLERANCE_S = 0.05  # a loaded 2-core machine; the proxy stamps arrival when the headers are parsed


async def _send_on_schedule(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        start = time.monotonic()

        async def one(offset: float, api: str, tokens: int) -> None:
            await asyncio.sleep(max(0.0, start + offset - time.monotonic()))
            body = (
                chat_body("hello there", tokens, stream=True, ignore_eos=True)
                if api == "chat"
                else completion_body("once upon a time", tokens, stream=True, ignore_eos=True)
            )
            path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
            async with session.post(url + path, data=encode(body)) as response:
                assert response.status == 200
                await response.read()

        await asyncio.gather(*(one(*entry) for entry in SCHEDULE))


def test_recorded_trace_replays_with_same_lengths_and_timing(tmp_path: Path) -> None:
    with upstream(token_delay=0.002) as base, recorder(base, tmp_path / "t.parquet", logs=tmp_path) as rec:
        asyncio.run(_send_on_schedule(rec.url))
        assert rec.stop() == 0
    trace = Trace.read(tmp_path / "t-0001.parquet")
    arrivals = trace.table.column("arrival_s").to_pylist()
    recorded_offsets = [a - arrivals[0] for a in arrivals]
    for (offset, api, tokens), got, row in zip(SCHEDULE, recorded_offsets, trace.table.to_pylist(), strict=True):
        assert abs(got - offset) < TIMING_TOLERANCE_S
        assert (row["api"], row["output_tokens"]) == (api, tokens)

    log = tmp_path / "replay-upstream.jsonl"
    with upstream(log=log) as target:
        result = run_cli(
            "replay", str(tmp_path / "t-0001.parquet"), "--url", target, "-o", str(tmp_path / "r.parquet"), timeout=120
        )
        assert result.returncode == 0, result.stdout + result.stderr
    received = read_log(log)
    assert len(received) == len(SCHEDULE)
    sent_offsets = [(r["recv_mono_ns"] - received[0]["recv_mono_ns"]) / 1e9 for r in received]
    for recorded, replayed in zip(recorded_offsets, sent_offsets, strict=True):
        assert abs(recorded - replayed) < TIMING_TOLERANCE_S
    asked = [json.loads(r["body"]).get("max_tokens") for r in received]
    assert asked == [tokens for _, _, tokens in SCHEDULE]
    results, _ = read_results(tmp_path / "r.parquet")
    assert sorted(results.column("output_tokens").to_pylist()) == sorted(t for _, _, t in SCHEDULE)
