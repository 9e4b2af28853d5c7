"""Result files of earlier schema versions still read: the columns added since come back null (schema 1's token
counts also name their source, one token per text chunk), so older run directories stay analysable."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from harness.records.result_io import read_results
from harness.records.result_schema import META_ARM, META_REPEAT, RESULT_KIND, RESULT_SCHEMA, TEXT_CHUNKS
from harness.records.trace_schema import META_KIND, META_SCHEMA_VERSION

ADDED_IN = {"2": ("token_counts", "token_count_source"), "3": ("tenant",)}


def write_old_file(path: Path, version: str) -> None:
    """Two finished requests as an earlier writer stored them: without the columns of later versions."""
    later = {name for v, names in ADDED_IN.items() if v > version for name in names}
    fields = [f for f in RESULT_SCHEMA if f.name not in later]
    rows = {f.name: [None, None] for f in fields} | {
        "request_id": ["r0", "r1"],
        "arm": ["baseline"] * 2,
        "repeat": [0, 0],
        "intended_s": [0.0, 0.5],
        "status": [200, 200],
        "token_times": [[0.1, 0.2], [0.1]],
        "output_tokens": [2, 1],
    }
    meta = {META_SCHEMA_VERSION: version, META_KIND: RESULT_KIND, META_ARM: "baseline", META_REPEAT: "0"}
    table = pa.Table.from_pydict(rows, schema=pa.schema(fields)).replace_schema_metadata(meta)
    pq.write_table(table, path)


def test_schema_1_and_2_files_read_in_the_current_schema(tmp_path: Path) -> None:
    for version in ("1", "2"):
        write_old_file(tmp_path / f"v{version}.parquet", version)
        table, meta = read_results(tmp_path / f"v{version}.parquet")
        assert table.schema == RESULT_SCHEMA and meta[META_SCHEMA_VERSION] == version
        assert table.column("tenant").to_pylist() == [None, None]
        assert pc.list_flatten(table.column("token_times")).to_numpy() == pytest.approx([0.1, 0.2, 0.1])
        assert table.column("output_tokens").to_pylist() == [2, 1]
    v1, _ = read_results(tmp_path / "v1.parquet")
    assert v1.column("token_count_source").to_pylist() == [TEXT_CHUNKS] * 2  # each text chunk was one token
    assert v1.column("token_counts").to_pylist() == [None, None]
