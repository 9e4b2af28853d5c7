"""Receive-side fidelity against real loopback servers: a worker that cannot keep up with the chunks it is sent
is judged client-bound; one that can measures the server's pace.

Both runs use one receive-lag budget, RECEIVE_BUDGET_S. It sits above what host contention alone adds to an
idle loop on the shared 2-core test box (p99 up to ~7 ms, max ~20 ms there) and far below a saturated
worker's lateness here (one worker parsing 64 × 500 chunks that all arrive at once: 300 ms on that box).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.records.fidelity import CLIENT_BOUND
from harness.records.result_schema import META_WORKER_LOADS
from harness.records.worker_load import loads_from_meta
from harness.replay.finalize import META_INVALID_REASONS, META_VALID
from harness.replay.summary import latency_percentiles
from tests.replay.support import make_trace, replay
from tests.support.openai_server import upstream

RECEIVE_BUDGET_S = 0.03
PACE_S = 0.01  # the server's per-token pace in the light run; one token per chunk


def test_a_worker_flooded_with_chunks_is_client_bound(tmp_path: Path) -> None:
    # A burst server writes each whole answer at once, almost free per token: the one worker is the bottleneck.
    with upstream("ok", burst=True) as url:
        outcome, table, meta = replay(
            make_trace(n=64, gap_s=0.0, output_tokens=500),
            url,
            tmp_path / "r.parquet",
            receive_lag_budget_s=RECEIVE_BUDGET_S,
            lag_budget_s=1.0,
        )
    assert outcome.errors == {} and all(n == 500 for n in table.column("output_tokens").to_pylist())
    (worker,) = outcome.fidelity.worker_loads or ()
    assert worker.samples > 0 and worker.receive_lag_p99_s > RECEIVE_BUDGET_S
    assert not outcome.fidelity.valid
    (reason,) = outcome.fidelity.reasons  # send timing was given ample room: only the receive side fails
    assert reason.startswith(CLIENT_BOUND) and "worker 0" in reason
    assert meta[META_VALID] == "false" and meta[META_INVALID_REASONS].startswith(CLIENT_BOUND)
    assert loads_from_meta(meta) == outcome.fidelity.worker_loads  # stored per worker, to be re-judged later


@pytest.mark.timing
def test_a_light_load_is_valid_and_measures_the_servers_pace(tmp_path: Path) -> None:
    with upstream("ok", token_delay=PACE_S) as url:
        outcome, table, meta = replay(
            make_trace(n=8, gap_s=0.02, output_tokens=50),
            url,
            tmp_path / "r.parquet",
            workers=2,
            receive_lag_budget_s=RECEIVE_BUDGET_S,
            lag_budget_s=0.05,
        )
    assert outcome.fidelity.valid and outcome.complete, outcome.fidelity.reasons
    stored = json.loads(meta[META_WORKER_LOADS])
    assert [w["worker"] for w in stored] == [0, 1] and all(w["samples"] > 0 for w in stored)
    assert all(0 < w["cpu_share"] < 1 for w in stored)
    assert outcome.fidelity.receive_lag_p99_s is not None and outcome.fidelity.receive_lag_p99_s <= RECEIVE_BUDGET_S
    tpot = next(row for row in latency_percentiles(table) if row.name == "TPOT")
    assert tpot.samples == 8 and tpot.values is not None
    assert all(value == pytest.approx(PACE_S, rel=0.05) for value in tpot.values)
