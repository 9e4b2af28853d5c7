"""The OpenAI API of a real `serve-sim` subprocess on loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from harness.analysis.server_metrics import server_means
from tests.sim.support import SimProcess, get, metric_value, post_json, start_sim, stream_events

PROMPT = "t17 t99 hello world"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    server = start_sim("--served-model-name", "m", "--seed", "7", "--max-model-len", "4096", mark_child=False)
    try:
        yield server
    finally:
        server.stop()


def completion_body(**extra: object) -> dict[str, object]:
    return {"model": "m", "prompt": PROMPT, "max_tokens": 12, "min_tokens": 12, "ignore_eos": True} | extra


def test_every_startup_log_line_says_simulated(sim: SimProcess) -> None:
    assert sim.log_lines and all(line.startswith("SIMULATED ENGINE") for line in sim.log_lines)


def test_models_entry_says_simulated(sim: SimProcess) -> None:
    body = json.loads(get(sim.url + "/v1/models")[1])
    entry = body["data"][0]
    assert entry["id"] == "m" and "simulated" in entry["owned_by"] and entry["simulated"] is True


def test_health_is_ready(sim: SimProcess) -> None:
    assert get(sim.url + "/health")[0] == 200


def test_streamed_completion_has_exact_length_and_usage(sim: SimProcess) -> None:
    events = list(stream_events(sim.url + "/v1/completions", completion_body(stream_options={"include_usage": True})))
    assert events[-1] == "[DONE]"
    token_chunks = [e for e in events[:-1] if e["choices"]]
    assert len(token_chunks) == 12
    assert [c["choices"][0]["finish_reason"] for c in token_chunks] == [None] * 11 + ["length"]
    usage = events[-2]["usage"]
    assert usage == {"prompt_tokens": 4, "completion_tokens": 12, "total_tokens": 16}
    text = "".join(c["choices"][0]["text"] for c in token_chunks)
    assert len(text.split()) == 12


def test_the_clients_request_id_names_the_response_as_vllm_does(sim: SimProcess) -> None:
    url = sim.url + "/v1/completions"
    first = post_json(url, completion_body(), headers={"X-Request-Id": "rb-candidate-r2-0a1b2c3d-req-7"})[1]
    again = post_json(url, completion_body(), headers={"X-Request-Id": "rb-candidate-r2-0a1b2c3d-req-7"})[1]
    assert first["id"] == again["id"] == "cmpl-rb-candidate-r2-0a1b2c3d-req-7"  # a repeated id is still served
    assert post_json(url, completion_body())[1]["id"].startswith("cmpl-sim")  # no header: the server's own


def test_streamed_chat_opens_with_role_and_counts_tokens(sim: SimProcess) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 5,
        "min_tokens": 5,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    events = list(stream_events(sim.url + "/v1/chat/completions", body))
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    contents = [e["choices"][0]["delta"]["content"] for e in events[1:-2]]
    assert len(contents) == 5 and all(c.strip() for c in contents)
    assert events[-2]["usage"]["completion_tokens"] == 5


def test_output_is_deterministic_for_the_same_request(sim: SimProcess) -> None:
    first = post_json(sim.url + "/v1/completions", completion_body())[1]
    second = post_json(sim.url + "/v1/completions", completion_body())[1]
    other_seed = post_json(sim.url + "/v1/completions", completion_body(seed=3))[1]
    assert first["choices"][0]["text"] == second["choices"][0]["text"]
    assert first["choices"][0]["text"] != other_seed["choices"][0]["text"]
    assert first["usage"]["completion_tokens"] == 12


def test_without_ignore_eos_min_and_max_tokens_bound_the_length(sim: SimProcess) -> None:
    for i in range(6):
        body = {"prompt": f"{PROMPT} {i}", "max_tokens": 40, "min_tokens": 20}
        status, reply = post_json(sim.url + "/v1/completions", body)
        n = reply["usage"]["completion_tokens"]
        assert status == 200 and 20 <= n <= 40
        assert reply["choices"][0]["finish_reason"] == ("length" if n == 40 else "stop")


def test_tokenize_is_word_level(sim: SimProcess) -> None:
    status, body = post_json(sim.url + "/tokenize", {"prompt": "t17 t99 hello"})
    assert status == 200 and body["count"] == 3 and body["tokens"][:2] == [17, 99]
    assert post_json(sim.url + "/tokenize", {"messages": [{"role": "user", "content": "a b"}]})[1]["count"] == 2


def test_too_long_and_malformed_requests_are_400(sim: SimProcess) -> None:
    status, body = post_json(sim.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 5000})
    assert status == 400 and "maximum context length" in body["error"]["message"]
    assert post_json(sim.url + "/v1/completions", {"prompt": 5})[0] == 400
    assert post_json(sim.url + "/v1/completions", completion_body(min_tokens=50))[0] == 400


def test_metrics_count_tokens_and_say_simulated(sim: SimProcess) -> None:
    before = metric_value(get(sim.url + "/metrics")[1], "vllm:generation_tokens_total")
    post_json(sim.url + "/v1/completions", completion_body())
    text = get(sim.url + "/metrics")[1]
    assert metric_value(text, "replaybench_simulated") == 1
    assert metric_value(text, "vllm:generation_tokens_total") == before + 12
    assert metric_value(text, "vllm:num_requests_running") == 0
    assert metric_value(text, "replaybench_sim_step_duration_seconds_count") > 0
    assert metric_value(text, "replaybench_sim_step_lateness_seconds_count") > 0
    assert metric_value(text, "replaybench_sim_step_lateness_max_seconds") >= 0


def test_latency_histograms_are_stamped_from_step_deadlines(sim: SimProcess) -> None:
    """Read back as the server cross-check reads vLLM: one 12-token and one 1-token request."""
    before = get(sim.url + "/metrics")[1]
    post_json(sim.url + "/v1/completions", completion_body())
    post_json(sim.url + "/v1/completions", completion_body(max_tokens=1, min_tokens=1))
    means = server_means(before, get(sim.url + "/metrics")[1])
    assert means.missing == () and means.notes == ()
    assert (means.requests, means.generated_tokens, means.preemptions) == (2, 13, 0)
    # the 1-token request is out of the TPOT mean (vLLM observes it as 0), so TPOT is the 12-token one's
    # (last - first deadline) / 11, which is the mean of its 11 step gaps
    assert means.tpot_mean_s == pytest.approx(means.itl_mean_s, rel=1e-9)
    assert means.itl_mean_s > 0.004  # a modelled batch-1 decode step (~5 ms), not host timing
    assert means.e2e_mean_s > means.ttft_mean_s > 0


def test_decode_timing_follows_the_cost_model(sim: SimProcess) -> None:
    """One request alone: steps are ~5.2 ms (calibrated batch-1 decode), so 12 tokens take > 50 ms.

    A lower bound only (the engine must not run faster than its model); a slow host cannot make it fail."""
    import time

    started = time.monotonic()
    post_json(sim.url + "/v1/completions", completion_body())
    assert time.monotonic() - started > 0.05


def test_client_disconnect_aborts_the_sequence(sim: SimProcess) -> None:
    """A client that leaves mid-stream must not keep a running sequence (and its memory) in the engine."""
    import time

    body = {"prompt": PROMPT, "max_tokens": 3000, "min_tokens": 3000, "ignore_eos": True}
    events = stream_events(sim.url + "/v1/completions", body)
    assert next(events)["choices"]
    assert metric_value(get(sim.url + "/metrics")[1], "vllm:num_requests_running") == 1
    events.close()  # closes the HTTP response and its socket
    deadline = time.monotonic() + 10
    while metric_value(get(sim.url + "/metrics")[1], "vllm:num_requests_running") != 0:
        assert time.monotonic() < deadline, "the aborted sequence is still running"
        time.sleep(0.05)
    assert metric_value(get(sim.url + "/metrics")[1], "vllm:kv_cache_usage_perc") == 0
