"""Open the HTML report in headless Chromium: no errors, every figure rendered, a screenshot kept as an artifact."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from harness.report.build import build_report
from tests.report.test_report import write_complete_run

pytestmark = pytest.mark.browser

HERE = Path(__file__).parent
ARTIFACTS = HERE.parents[1] / "test-artifacts"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=10000",
]


@pytest.fixture(scope="module")
def chromium() -> str:
    ensure = subprocess.run(["sh", str(HERE / "ensure_chromium.sh")], capture_output=True, text=True, timeout=600)
    if ensure.returncode != 0:
        pytest.skip(ensure.stderr.strip().splitlines()[-1] if ensure.stderr.strip() else "chromium unavailable")
    return "chromium"


def run_chromium(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, start_new_session=True)


def test_report_loads_cleanly_in_chromium(chromium: str, tmp_path: Path) -> None:
    run = write_complete_run(tmp_path / "run", itl_factor=0.8)
    build_report(run.root)
    url = run.index_html.resolve().as_uri()

    dom = run_chromium(chromium, tmp_path / "profile-dom", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html_tag = re.search(r"<html[^>]*>", dom.stdout).group(0)
    assert 'data-figures-rendered="5/5"' in html_tag, html_tag
    assert "data-errors" not in html_tag, html_tag
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console

    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "report.png"
    screenshot.unlink(missing_ok=True)
    shot = run_chromium(
        chromium, tmp_path / "profile-shot", "--window-size=1280,5200", f"--screenshot={screenshot}", url
    )
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert screenshot.stat().st_size > 50_000  # a rendered page, not a blank one
