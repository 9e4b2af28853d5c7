"""replay_fidelity on hand-made result tables with known lag, rate, output lengths and worker receive lag."""

from __future__ import annotations

import pytest

from harness.records.fidelity import CLIENT_BOUND, DEFAULT_RECEIVE_LAG_BUDGET_S, offered_rate_of, replay_fidelity
from harness.records.result_io import results_table
from harness.records.worker_load import WorkerLoad
from harness.replay.summary import receive_lag_line


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


def worker(index: int, p99_s: float | None, cpu: float = 0.4) -> WorkerLoad:
    return WorkerLoad(index, 0 if p99_s is None else 200, p99_s and p99_s / 4, p99_s, p99_s and p99_s * 2, cpu)


def test_a_worker_over_the_receive_lag_budget_makes_the_run_client_bound() -> None:
    intended = [i * 0.01 for i in range(100)]
    loads = [worker(0, 0.001), worker(1, 0.012, cpu=0.97), worker(2, 0.008)]
    fid = replay_fidelity(table(intended, [0.0001] * 100), worker_loads=loads)
    assert not fid.valid and len(fid.reasons) == 1
    (reason,) = fid.reasons
    assert reason.startswith(CLIENT_BOUND) and "12.00 ms on replay worker 1 at 97 % CPU" in reason
    assert "2 of 3 worker(s)" in reason and f"{DEFAULT_RECEIVE_LAG_BUDGET_S * 1e3:g} ms budget" in reason
    assert fid.receive_lag_p99_s == 0.012 and fid.busiest_worker == loads[1] and fid.worker_loads == tuple(loads)
    assert "use more replay workers" in reason
    assert replay_fidelity(table(intended, [0.0001] * 100), worker_loads=loads, receive_lag_budget_s=0.02).valid
    starved = replay_fidelity(table(intended, [0.0001] * 100), worker_loads=[worker(0, 0.03, cpu=0.1)])
    assert "at 10 % CPU" in starved.reasons[0] and "other processes on the host" in starved.reasons[0]


def test_receive_lag_not_measured_is_not_gated() -> None:
    intended = [i * 0.01 for i in range(100)]
    old = replay_fidelity(table(intended, [0.0001] * 100))  # a result file from before the measurement
    assert old.valid and old.worker_loads is None and old.receive_lag_p99_s is None and old.busiest_worker is None
    idle = replay_fidelity(table(intended, [0.0001] * 100), worker_loads=[worker(0, None)])  # no samples
    assert idle.valid and idle.receive_lag_p99_s is None


def test_the_summary_line_says_what_is_known_about_receive_lag() -> None:
    rows = table([i * 0.01 for i in range(10)], [0.0001] * 10)
    measured = receive_lag_line(replay_fidelity(rows, worker_loads=[worker(0, 0.001), worker(1, 0.004, cpu=0.97)]))
    assert "p99 4.00 ms" in measured and "busiest of 2 worker(s) (budget 5 ms)" in measured
    assert measured.endswith("CPU share max 97 %")
    assert "predates it); not gated" in receive_lag_line(replay_fidelity(rows))
    assert "no samples" in receive_lag_line(replay_fidelity(rows, worker_loads=[worker(0, None)]))
