"""The vllm==0.24.0 CPU venv for the test_vllm_*.py files, built (or found in the cache) once per pytest session.

The shared helpers' asserts are rewritten like a test module's, so their failures show the values compared.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.replayssm.integration.check_runner", "tests.replayssm.integration.native_regime")

from tests.replayssm.integration.check_runner import REPO, run_with_timeout  # noqa: E402


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    built = run_with_timeout(["bash", str(REPO / "tools" / "vllm_venv.sh")], timeout=900)
    assert built.returncode == 0, f"tools/vllm_venv.sh failed: {built.stderr.strip()}"
    return Path(built.stdout.strip().splitlines()[-1]) / "bin" / "python"
