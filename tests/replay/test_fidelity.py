"""replay_fidelity on hand-made result tables with known lag, rate and output lengths."""

from __future__ import annotations

import pytest

from harness.records.fidelity import offered_rate_of, replay_fidelity
from harness.records.result_io import results_table


def table(
    intended: list[float],
    lags: list[float | None],
    out: list[int] | None = None,
    errors: list[str | None] | None = None,
):
    n = len(intended)
    out = out or [4] * n
    errors = errors or [None] * n
    return results_table(
        {
            "request_id": f"r{i}",
            "arm": "a",
            "repeat": 0,
            "intended_s": intended[i],
            "sent_s": None if lags[i] is None else intended[i] + lags[i],
            "lag_s": lags[i],
            "output_tokens": out[i],
            "expected_output_tokens": 4,
            "error": errors[i],
        }
        for i in range(n)
    )


def test_perfect_replay_is_valid_at_exactly_the_offered_rate() -> None:
    intended = [i * 0.01 for i in range(101)]
    fid = replay_fidelity(table(intended, [0.0001] * 101))
    assert fid.valid and fid.reasons == ()
    assert fid.offered_rate == pytest.approx(101 / 1.0) and fid.achieved_rate == pytest.approx(fid.offered_rate)
    assert fid.rate_error == pytest.approx(0.0, abs=1e-9)
    assert (fid.lag_p50_s, fid.lag_max_s, fid.sent, fid.requests) == (
        pytest.approx(0.0001),
        pytest.approx(0.0001),
        101,
        101,
    )


def test_lag_over_budget_is_invalid() -> None:
    intended = [i * 0.01 for i in range(100)]
    lags = [0.0001] * 97 + [0.005] * 3  # 3 % of requests 5 ms late -> p99 over 2 ms
    fid = replay_fidelity(table(intended, lags))
    assert not fid.valid and fid.lag_max_s == pytest.approx(0.005)
    assert any("p99 send lag" in r for r in fid.reasons)
    assert replay_fidelity(table(intended, lags), lag_budget_s=0.01).valid


def test_growing_lag_misses_the_rate() -> None:
    intended = [i * 0.01 for i in range(100)]
    lags = [i * 0.0003 for i in range(100)]  # the client falls behind: span 0.99 s -> 1.0197 s
    fid = replay_fidelity(table(intended, lags), lag_budget_s=1.0)
    assert fid.rate_error == pytest.approx(0.99 / (0.99 + 99 * 0.0003) - 1)
    assert not fid.valid and any("achieved rate" in r for r in fid.reasons)


def test_mismatches_count_only_successes_and_queue_errors_invalidate() -> None:
    fid = replay_fidelity(
        table(
            [0.0, 0.1, 0.2, 0.3],
            [0.0, 0.0, 0.0, None],
            out=[4, 3, 2, 0],
            errors=[None, None, "timeout", "client_queue"],
        )
    )
    assert (fid.output_mismatches, fid.client_queue_errors, fid.sent) == (1, 1, 3)
    assert not fid.valid


def test_nothing_sent_is_invalid_not_a_crash() -> None:
    fid = replay_fidelity(table([0.0, 1.0], [None, None]))
    assert not fid.valid and fid.lag_p99_s is None and fid.achieved_rate is None
    assert "no request was sent" in fid.reasons


def test_offered_rate_needs_two_distinct_times() -> None:
    assert offered_rate_of([1.0]) is None and offered_rate_of([2.0, 2.0]) is None
    assert offered_rate_of([0.0, 0.5, 1.0]) == pytest.approx(3.0)
