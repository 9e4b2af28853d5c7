"""Speculative decoding in the embedded engine: synthetic acceptance, several tokens per step and per SSE chunk,
and vLLM's `vllm:spec_decode_*` counters in /metrics, read back by the harness's own parser."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from harness.analysis.server_metrics import parse_snapshots
from harness.analysis.spec_decode import spec_decode_run
from harness.errors import UserError
from harness.sim.commands import _spec
from harness.sim.engine_core import EngineCore
from harness.sim.speculation import Speculation, speculation_of
from harness.sim.virtual import RequestSpec, run_virtual
from tests.sim.support import SimProcess, get, stream_events

OUTPUT = 48


def test_acceptance_follows_the_minimum_variance_schedule() -> None:
    assert Speculation(3, 3.0).rates == [1.0, 1.0, 0.0]
    assert Speculation(3, 2.5).rates == [1.0, 0.5, 0.0]
    assert Speculation(3, 1.0).rates == [0.0, 0.0, 0.0]
    rng = random.Random(1)
    assert {Speculation(3, 3.0).accepted(rng) for _ in range(50)} == {2}
    draws = [Speculation(3, 2.5).accepted(rng) for _ in range(4000)]
    assert set(draws) == {1, 2} and 1 + sum(draws) / len(draws) == pytest.approx(2.5, abs=0.03)


@pytest.mark.parametrize(
    ("tokens", "length", "message"),
    [(3, 4.5, r"in \[1, 4\]"), (0, 2.0, "needs --spec-tokens"), (-1, None, "at least 1")],
)
def test_bad_speculation_options_are_one_line_errors(tokens: int, length: float | None, message: str) -> None:
    with pytest.raises(UserError, match=message):
        speculation_of(tokens, length) if tokens >= 0 else Speculation(tokens, 2.0)


def _decode(spec_tokens: int, acceptance_length: float | None) -> tuple[list[int], float]:
    """One request of OUTPUT tokens alone in virtual time: (tokens per step, decode seconds)."""
    spec = _spec(
        None, "h200", "baseline", "float32", 16, False, 256, 8192, None, None, 1, spec_tokens, acceptance_length
    )
    run = run_virtual(EngineCore(spec), [RequestSpec("r", 0.0, 64, OUTPUT)])
    times = run.token_times(run.requests[0])
    return run.requests[0].token_counts, times[-1] - times[0]


def test_a_verify_step_emits_the_accepted_drafts_plus_one_and_costs_more_than_a_plain_step() -> None:
    plain_counts, plain_s = _decode(0, None)
    counts, spec_s = _decode(3, 3.0)
    assert plain_counts == [1] * OUTPUT
    assert counts == [1] + [3] * 15 + [2] and sum(counts) == OUTPUT  # the last step is cut at max_tokens
    per_step_plain, per_step_spec = plain_s / (OUTPUT - 1), spec_s / (len(counts) - 1)
    assert per_step_spec > per_step_plain  # 4 tokens verified, 1 + k state copies written
    assert spec_s < plain_s  # but 3 tokens per step


def test_serve_sim_streams_one_chunk_per_step_and_counts_drafts_like_vllm(
    sim_server: Callable[..., SimProcess],
) -> None:
    sim = sim_server("--served-model-name", "m", "--spec-tokens", "3", "--acceptance-length", "3")
    assert any("speculative decoding: spec k=3 AL=3 (synthetic acceptance)" in line for line in sim.log_lines)
    before = get(sim.url + "/metrics")[1]
    body = {"model": "m", "prompt": "a b c d", "max_tokens": OUTPUT, "min_tokens": OUTPUT, "ignore_eos": True}
    options = {"include_usage": True, "continuous_usage_stats": True}
    events = [e for e in stream_events(sim.url + "/v1/completions", body | {"stream_options": options})]
    chunks = [e for e in events if isinstance(e, dict) and e["choices"]]
    cumulative = [c["usage"]["completion_tokens"] for c in chunks]
    assert [b - a for a, b in zip([0, *cumulative], cumulative, strict=False)] == [1] + [3] * 15 + [2]
    assert all(len(c["choices"][0]["text"].split()) == n for c, n in zip(chunks, [1] + [3] * 15 + [2], strict=True))
    run = spec_decode_run(parse_snapshots(before, get(sim.url + "/metrics")[1]), 1.0, configured=None)
    assert (run.drafts, run.draft_tokens, run.accepted_tokens) == (16, 48, 32)  # drawn before the cut, as vLLM
    assert run.acceptance_length == 3.0 and run.acceptance_by_position == [1.0, 1.0, 0.0]
    assert run.engine_steps == 17  # the prefill step and 16 verify steps
    assert run.step_time_mean_s is not None and run.step_time_mean_s > 0


def test_without_speculation_the_server_has_no_spec_decode_series(sim_server: Callable[..., SimProcess]) -> None:
    text = get(sim_server("--served-model-name", "m").url + "/metrics")[1]
    assert "vllm:spec_decode" not in text and "vllm:iteration_tokens_total_count" in text
