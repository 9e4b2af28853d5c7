"""Fault-injection flags of serve-sim, against real subprocesses."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error

import pytest

from harness.sim.faults import CRASH_EXIT_CODE
from tests.sim.support import REPO, get, metric_value, post_json, stream_events

BODY = {"prompt": "t1 t2", "max_tokens": 8, "min_tokens": 8, "ignore_eos": True}


def test_fail_rate_one_answers_500(sim_server) -> None:
    sim = sim_server("--fail-rate", "1")
    status, body = post_json(sim.url + "/v1/completions", BODY)
    assert status == 500 and "injected" in body["error"]["message"]
    assert metric_value(get(sim.url + "/metrics")[1], "replaybench_sim_injected_failures_total") == 1


def test_stall_after_tokens_stops_the_stream_but_keeps_it_open(sim_server) -> None:
    sim = sim_server("--stall-after-tokens", "3")
    received = []
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        for event in stream_events(sim.url + "/v1/completions", BODY, timeout=1.5):
            received.append(event)
    assert len(received) == 3


def test_crash_after_requests_exits_hard(sim_server) -> None:
    sim = sim_server("--crash-after-requests", "1")
    assert post_json(sim.url + "/v1/completions", BODY)[0] == 200
    with pytest.raises((ConnectionError, urllib.error.URLError)):
        post_json(sim.url + "/v1/completions", BODY, timeout=5)
    assert sim.process.wait(timeout=10) == CRASH_EXIT_CODE


def test_startup_delay_answers_503_until_ready(sim_server) -> None:
    sim = sim_server("--startup-delay", "1.5")
    assert get(sim.url + "/health")[0] == 503
    assert post_json(sim.url + "/v1/completions", BODY)[0] == 503
    deadline = time.monotonic() + 10
    while get(sim.url + "/health")[0] != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert post_json(sim.url + "/v1/completions", BODY)[0] == 200


def test_port_in_use_is_one_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "harness.sim", "--port", str(port)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]  # one line, no traceback
    assert "choose a free --port" in done.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--fail-rate", "2"], "--fail-rate"),
        (["--policy", "fancy"], "--policy"),
        (["--gpu", "tpu"], "--gpu"),
        (["--model-config", "nope.json"], "no such model config"),
        (["--model-config", "qwen9"], "unknown model 'qwen9'"),
        (["--model-config", "qwen3.5-4b", "--policy", "replayssm", "--ssm-dtype", "bfloat16"], "Gated DeltaNet"),
    ],
)
def test_bad_options_are_one_clear_error(args: list[str], needle: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "harness.sim", "--port", "0", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and needle in done.stderr and "Traceback" not in done.stderr
