"""The Parquet traces shipped in `traces/` are exactly what the documented import commands produce."""

from __future__ import annotations

import pytest

from harness.trace.importers import import_trace
from harness.trace.model import Trace
from tests.trace.support import AZURE_CODE, AZURE_CONV, BURSTGPT, REPO

SHIPPED = [
    ("azure-conv-2023.parquet", "azure", AZURE_CONV),
    ("azure-code-2023.parquet", "azure", AZURE_CODE),
    ("burstgpt-1-first400.parquet", "burstgpt", BURSTGPT),
]


@pytest.mark.parametrize(("name", "fmt", "source"), SHIPPED, ids=[s[0] for s in SHIPPED])
def test_shipped_trace_matches_a_fresh_import_of_its_source(name, fmt, source):
    shipped = Trace.read(REPO / "traces" / name)
    fresh = import_trace(fmt, source).trace
    assert shipped.table.equals(fresh.table)
    assert shipped.metadata["source"] == str(source.relative_to(REPO))
    for key in ("clock", "redaction"):
        assert shipped.metadata[key] == fresh.metadata[key]
