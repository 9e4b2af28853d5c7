"""The `import`, `export` and `inspect` command lines, run as a user runs them (subprocess)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from harness.trace.importers import import_trace
from harness.trace.model import Trace
from tests.trace.support import AZURE_CONV, BURSTGPT, replaybench, write_lines


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_import_writes_a_valid_trace_and_summarises(tmp_path):
    out = tmp_path / "burst.parquet"
    result = replaybench("import", "burstgpt", BURSTGPT, "-o", out)
    assert result.returncode == 0, result.stderr
    assert "imported 400 requests" in result.stdout
    assert "17 failed request(s)" in result.stdout
    trace = Trace.read(out)
    assert len(trace) == 400
    assert trace.metadata["source"] == str(BURSTGPT)


def test_import_slice_options(tmp_path):
    out = tmp_path / "slice.parquet"
    result = replaybench(
        "import",
        "azure",
        AZURE_CONV,
        "-o",
        out,
        "--start",
        "60",
        "--duration",
        "120",
        "--limit",
        "500",
        "--time-scale",
        "0.5",
    )
    assert result.returncode == 0, result.stderr
    trace = Trace.read(out)
    full = import_trace("azure", AZURE_CONV).trace.arrivals.to_numpy()
    window = full[(full >= 60) & (full < 180)][:500]
    assert len(trace) == len(window) == 500
    np.testing.assert_allclose(trace.arrivals.to_numpy(), (window - window[0]) * 0.5)
    assert "kept" in result.stdout and "time_scale=0.5" in trace.metadata["slice"]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["azure", "missing.csv", "-o", "{out}"], ["missing.csv: no such file"]),
        (["azrue", str(AZURE_CONV), "-o", "{out}"], ["unknown import format 'azrue'", "azure, burstgpt"]),
        (["azure", str(BURSTGPT), "-o", "{out}"], ["missing column(s) TIMESTAMP"]),
        (["azure", "{bad}", "-o", "{out}"], ["has 'not-a-time' at data row 1"]),
        (["azure", "{empty}", "-o", "{out}"], ["the file is empty"]),
        (["azure", str(AZURE_CONV)], ["no output file given; add -o"]),
        (["azure", str(AZURE_CONV), "-o", "{out}", "--start", "99999"], ["holds no requests"]),
        (["azure", str(AZURE_CONV), "-o", "{out}", "--time-scale", "0"], ["--time-scale must be > 0"]),
        (["mooncake", str(BURSTGPT), "-o", "{out}"], ["not valid JSON"]),
    ],
    ids=["missing", "format", "column", "timestamp", "empty", "no-output", "empty-slice", "scale", "wrong-format"],
)
def test_bad_import_is_one_error_line_exit_2_and_no_output(tmp_path, args, fragments):
    bad = write_lines(tmp_path / "bad.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens", "not-a-time,1,2"])
    empty = tmp_path / "empty.csv"
    empty.touch()
    out = tmp_path / "out.parquet"
    args = [a.format(out=out, bad=bad, empty=empty) for a in args]
    assert_one_line_error(replaybench("import", *args, cwd=tmp_path), *fragments)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".part"] == []


def test_failed_import_leaves_an_existing_output_untouched(tmp_path):
    out = tmp_path / "trace.parquet"
    assert replaybench("import", "burstgpt", BURSTGPT, "-o", out).returncode == 0
    before = out.read_bytes()
    assert_one_line_error(replaybench("import", "azure", BURSTGPT, "-o", out), "missing column(s)")
    assert out.read_bytes() == before


def test_inspect_prints_the_load_and_writes_a_self_contained_page(tmp_path):
    trace = tmp_path / "burst.parquet"
    assert replaybench("import", "burstgpt", BURSTGPT, "-o", trace).returncode == 0
    page = tmp_path / "inspect.html"
    result = replaybench("inspect", trace, "--html", page)
    assert result.returncode == 0, result.stderr
    for expected in (
        "requests",
        "400",
        "burstiness (CV of gaps)",
        "4.56",
        "recorded as failed",
        "17",
        "sessions / tenants / models",
        "redaction: drop",
        "peak minute",
    ):
        assert expected in result.stdout
    html = page.read_text()
    assert html.count("data:image/png;base64,") == 3
    assert "http://" not in html and "https://" not in html
    assert "4.56" in html


def test_inspect_of_a_non_trace_is_one_error_line(tmp_path):
    assert_one_line_error(replaybench("inspect", BURSTGPT), "not a readable Parquet file")
    assert_one_line_error(replaybench("inspect", tmp_path / "none.parquet"), "no such trace file")


def test_export_then_import_through_the_command_line(tmp_path):
    trace = tmp_path / "burst.parquet"
    assert replaybench("import", "burstgpt", BURSTGPT, "-o", trace).returncode == 0
    exported = tmp_path / "burst.jsonl"
    result = replaybench("export", trace, "--format", "vllm-timed", "-o", exported)
    assert result.returncode == 0, result.stderr
    assert "vllm bench serve --dataset-name timed_trace" in result.stdout
    back = tmp_path / "back.parquet"
    assert replaybench("import", "vllm-timed", exported, "-o", back).returncode == 0
    original, again = pq.read_table(trace), pq.read_table(back)
    for name in ("arrival_s", "prompt_tokens", "output_tokens"):
        assert again.column(name).to_pylist() == original.column(name).to_pylist()


def test_bad_export_arguments_are_one_error_line(tmp_path):
    trace = tmp_path / "burst.parquet"
    assert replaybench("import", "burstgpt", BURSTGPT, "-o", trace).returncode == 0
    assert_one_line_error(
        replaybench("export", trace, "--format", "csv", "-o", tmp_path / "x"), "unknown export format 'csv'"
    )
    assert_one_line_error(replaybench("export", trace, "-o", tmp_path / "x"), "no export format given")
    assert_one_line_error(replaybench("export", trace, "--format", "mooncake"), "no output file given")
