"""Turn a run's segments into the final result Parquet (RESULT_SCHEMA + run metadata + fidelity inputs)."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pyarrow as pa

from harness.errors import UserError
from harness.records.fidelity import DEFAULT_RECEIVE_LAG_BUDGET_S, Fidelity, replay_fidelity
from harness.records.result_io import results_table, write_results
from harness.records.result_schema import META_COMPLETE
from harness.records.worker_load import loads_to_meta
from harness.replay.loop_probe import read_worker_loads
from harness.replay.segments import read_meta, read_rows

# Run metadata keys this package adds beside those of result_schema.
META_SCHEDULED = "replaybench.scheduled"
META_LAG_BUDGET_S = "replaybench.lag_budget_s"
META_RECEIVE_LAG_BUDGET_S = "replaybench.receive_lag_budget_s"
META_RATE_TOLERANCE = "replaybench.rate_tolerance"
META_SEED = "replaybench.seed"
META_WORKERS = "replaybench.workers"
META_MAX_INFLIGHT = "replaybench.max_inflight"
META_API = "replaybench.api"
META_STREAM = "replaybench.stream"
META_VALID = "replaybench.valid"
META_INVALID_REASONS = "replaybench.invalid_reasons"


def error_counts(table: pa.Table) -> dict[str, int]:
    return dict(Counter(e for e in table.column("error").to_pylist() if e is not None))


def finalize(directory: Path, output: Path, complete: bool) -> tuple[pa.Table, Fidelity]:
    """Write `output` from the segments in `directory` (then delete them); `complete` goes into the metadata."""
    meta = read_meta(directory)
    rows = sorted(read_rows(directory), key=lambda r: (r["intended_s"], r["request_id"]))
    table = results_table(rows)
    complete = complete and len(rows) == int(meta[META_SCHEDULED])
    loads = read_worker_loads(directory)
    fidelity = replay_fidelity(
        table,
        lag_budget_s=float(meta[META_LAG_BUDGET_S]),
        rate_tolerance=float(meta[META_RATE_TOLERANCE]),
        worker_loads=loads,
        receive_lag_budget_s=float(meta.get(META_RECEIVE_LAG_BUDGET_S, DEFAULT_RECEIVE_LAG_BUDGET_S)),
    )
    meta |= ({} if loads is None else loads_to_meta(loads)) | {
        META_COMPLETE: str(complete).lower(),
        META_VALID: str(fidelity.valid and complete).lower(),
        META_INVALID_REASONS: "; ".join(fidelity.reasons + (() if complete else ("run incomplete",))),
    }
    try:
        write_results(output, table, meta)
    except OSError as exc:
        raise UserError(
            f"cannot write {output} ({exc.strerror}); the finished rows are safe in {directory}: "
            f"make the path writable and run `replaybench replay-recover {output}`"
        ) from None
    shutil.rmtree(directory)
    return table, fidelity
