"""Live counters each worker process updates and the parent reads for the progress bar (shared memory, no locks).

Each slot has exactly one writer (its worker), so unlocked doubles are safe; the reader may see a value a
moment old, which is all a progress bar needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing.context import BaseContext

FIELDS = ("sent", "done", "errors", "inflight", "lag_s")
SENT, DONE, ERRORS, INFLIGHT, LAG = range(len(FIELDS))


@dataclass(frozen=True)
class Totals:
    sent: int
    done: int
    errors: int
    inflight: int
    lag_s: float  # the largest of the workers' latest send lags


class WorkerCounters:
    """A block of `len(FIELDS)` shared doubles per worker."""

    def __init__(self, workers: int, context: BaseContext) -> None:
        self._values = context.Array("d", workers * len(FIELDS), lock=False)

    def add(self, worker: int, field: int, delta: float) -> None:
        self._values[worker * len(FIELDS) + field] += delta

    def set(self, worker: int, field: int, value: float) -> None:
        self._values[worker * len(FIELDS) + field] = value

    def totals(self) -> Totals:
        values = list(self._values)
        column = [values[f :: len(FIELDS)] for f in range(len(FIELDS))]
        return Totals(
            sent=int(sum(column[SENT])),
            done=int(sum(column[DONE])),
            errors=int(sum(column[ERRORS])),
            inflight=int(sum(column[INFLIGHT])),
            lag_s=max(column[LAG]),
        )
