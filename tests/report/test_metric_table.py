"""The README's metric definitions are generated from the registry and must be up to date."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import UserError
from harness.records.metric_registry import METRICS
from harness.report.metric_table import COMMAND, MARKER, definitions_markdown, replace_marked_block, up_to_date_readme

README = Path(__file__).resolve().parents[2] / "README.md"


def run_table(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.report.metric_table", *args], capture_output=True, text=True, timeout=60
    )


def test_readme_definitions_are_up_to_date() -> None:
    current, fresh = up_to_date_readme(README)
    assert current == fresh, f"README.md's metric definitions are stale: run `{COMMAND}`"


def test_table_has_one_row_per_registered_metric_with_its_peers() -> None:
    rows = [line for line in definitions_markdown().splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [m.name for m in METRICS]
    icl = next(row for row in rows if row.startswith("| `icl`"))
    assert "its `itl` is this" in icl
    header = definitions_markdown().splitlines()[0]
    assert all(tool in header for tool in ("`vllm bench serve`", "GuideLLM", "AIPerf", "failed requests"))


def test_check_fails_on_a_stale_copy_and_a_rewrite_fixes_it(tmp_path: Path) -> None:
    stale = tmp_path / "README.md"
    stale.write_text(f"# title\n\n<!-- {MARKER} -->\nold table\n<!-- /{MARKER} -->\n\nafter\n")
    result = run_table("--check", str(stale))
    assert result.returncode == 1 and COMMAND in result.stderr and "old table" in stale.read_text()
    assert run_table(str(stale)).returncode == 0
    text = stale.read_text()
    assert "old table" not in text and text.startswith("# title\n") and text.endswith("\nafter\n")
    assert definitions_markdown() in text
    assert run_table("--check", str(stale)).returncode == 0


def test_missing_markers_are_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="add both marker lines"):
        replace_marked_block("no block here\n", MARKER, "x", "README.md")
    result = run_table(str(tmp_path / "absent.md"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "cannot read it" in result.stderr
