"""One healthy test upstream per module (started once; each test starts its own fault-mode servers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.openai_server import upstream


@pytest.fixture(scope="module")
def upstream_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("upstream") / "requests.jsonl"


@pytest.fixture(scope="module")
def ok_url(upstream_log: Path) -> Iterator[str]:
    with upstream("ok", log=upstream_log, token_delay=0.001) as url:
        yield url
