"""Recorded outcomes in a trace: which requests production saw fail (so replay and analysis can tell)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# `finish_reason` of a request that production recorded as failed (e.g. BurstGPT rows with 0 response tokens).
FAILED_FINISH_REASON = "error"
FIRST_FAILED_STATUS = 400


def failed_mask(table: pa.Table) -> np.ndarray:
    """True for rows recorded as failed: finish_reason "error" or an HTTP status >= 400."""
    by_reason = pc.fill_null(pc.equal(table.column("finish_reason"), FAILED_FINISH_REASON), False)
    by_status = pc.fill_null(pc.greater_equal(table.column("status"), FIRST_FAILED_STATUS), False)
    return pc.or_(by_reason, by_status).to_numpy(zero_copy_only=False)
