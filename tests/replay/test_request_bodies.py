"""Request bodies as the server receives them: identical across runs, prefix sharing, recorded text, params."""

from __future__ import annotations

import json
from pathlib import Path

from tests.replay.support import make_trace, replay
from tests.support.openai_server import read_log, upstream


def received_bodies(log: Path) -> list[dict]:
    return [json.loads(entry["body"]) for entry in read_log(log)]


def test_same_trace_and_seed_give_byte_identical_bodies(tmp_path: Path) -> None:
    trace = make_trace(n=5, gap_s=0.03, prompt_tokens=30, prefix_block_ids=[[1, 2], [1, 3], None, [1, 2], [4]])
    logs = [tmp_path / f"{name}.jsonl" for name in ("first", "second", "other-seed")]
    for log, seed in zip(logs, (7, 7, 8), strict=True):
        with upstream("ok", log=log) as url:  # a fresh server each time, like two arms
            replay(trace, url, tmp_path / f"{log.stem}.parquet", seed=seed)
    first, second, other = ([entry["body"] for entry in read_log(log)] for log in logs)
    assert len(first) == 5
    assert first == second  # raw bytes as received, in schedule order
    assert all(a != b for a, b in zip(first, other, strict=True))


def test_shared_prefix_blocks_share_prompt_words(ok_url: str, tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    trace = make_trace(
        n=4, gap_s=0.03, prompt_tokens=12, block_size=4, prefix_block_ids=[[1, 2, 3], [1, 2, 9], [5, 6, 7], [1, 2, 3]]
    )
    with upstream("ok", log=log) as url:
        replay(trace, url, tmp_path / "r.parquet")
    words = [body["prompt"].split() for body in received_bodies(log)]
    assert [len(w) for w in words] == [12, 12, 12, 12]
    assert words[0][:8] == words[1][:8] and words[0][8:] != words[1][8:]  # blocks 1, 2 shared; 3 vs 9 not
    assert words[0][:4] != words[2][:4]  # nothing shared
    assert words[0] == words[3]  # identical block lists fill the whole prompt


def test_recorded_text_is_sent_verbatim_with_forced_length(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    params = json.dumps({"temperature": 0.5, "top_p": 0.9, "stop": ["x"], "max_tokens": 99, "n": 2})
    trace = make_trace(
        n=2,
        gap_s=0.03,
        output_tokens=7,
        api="chat",
        prompt=[None, "plain text prompt"],
        messages=[json.dumps(messages), None],
        params=[params, params],
    )
    with upstream("ok", log=log) as url:
        replay(trace, url, tmp_path / "chat.parquet")
        replay(trace, url, tmp_path / "completions.parquet", api="completions", stream=False)
    bodies = received_bodies(log)
    forced = {"max_tokens": 7, "min_tokens": 7, "ignore_eos": True, "temperature": 0.5, "top_p": 0.9}
    streamed = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    assert bodies[0] == {"model": "test-model", "messages": messages} | forced | streamed
    assert (
        bodies[1]
        == {"model": "test-model", "messages": [{"role": "user", "content": "plain text prompt"}]} | forced | streamed
    )
    assert bodies[2] == {"model": "test-model", "prompt": "be brief\n\nhi there"} | forced | {"stream": False}
    assert bodies[3] == {"model": "test-model", "prompt": "plain text prompt"} | forced | {"stream": False}
    assert [entry["path"] for entry in read_log(log)] == ["/v1/chat/completions"] * 2 + ["/v1/completions"] * 2


def test_without_tokenize_prompts_fall_back_to_one_word_per_token(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    with upstream("ok", log=log, tokenize=False) as url:
        _, completions, _ = replay(make_trace(n=1, prompt_tokens=9), url, tmp_path / "c.parquet")
        _, chat, _ = replay(make_trace(n=1, prompt_tokens=9, api="chat"), url, tmp_path / "h.parquet")
    bodies = received_bodies(log)
    assert len(bodies[0]["prompt"].split()) == 9 and len(bodies[1]["messages"][0]["content"].split()) == 9
    assert completions.column("prompt_tokens_server").to_pylist() == [9]
    assert chat.column("prompt_tokens_server").to_pylist() == [11]  # the template's 2 tokens were not known


def test_rows_that_failed_in_production_still_send_a_valid_request(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    with upstream("ok", log=log) as url:
        outcome, table, _ = replay(make_trace(n=1, prompt_tokens=0, output_tokens=0), url, tmp_path / "r.parquet")
    body = received_bodies(log)[0]
    assert len(body["prompt"].split()) == 1 and (body["max_tokens"], body["min_tokens"]) == (1, 1)
    row = table.to_pylist()[0]
    assert (row["error"], row["output_tokens"], row["expected_output_tokens"], row["prompt_tokens"]) == (None, 1, 1, 0)
    assert outcome.fidelity.output_mismatches == 0
