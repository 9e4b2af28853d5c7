"""`--workers 2`: two processes on one port; every request recorded exactly once, on SIGTERM and after kill -9."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from harness.trace.model import Trace
from tests.record.recorder_process import recorder, run_cli
from tests.record.traffic import completion_body, encode
from tests.support.openai_server import upstream

REQUESTS = 60


def _send_all(url: str, prompts: list[str]) -> list[int]:
    """One new connection per request, so the kernel spreads them over both workers; 8 at a time."""

    async def run() -> list[int]:
        gate = asyncio.Semaphore(8)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:

            async def one(prompt: str) -> int:
                async with (
                    gate,
                    session.post(
                        f"{url}/v1/completions", data=encode(completion_body(prompt, 3, stream=True))
                    ) as response,
                ):
                    await response.read()
                    return response.status

            return await asyncio.gather(*(one(p) for p in prompts))

    return asyncio.run(run())


def _prompts_in(parts: list[Path]) -> list[str]:
    return [p for part in parts for p in Trace.read(part).table.column("prompt").to_pylist()]


def test_two_workers_record_every_request_once(tmp_path: Path) -> None:
    out = tmp_path / "out"
    prompts = [f"w{i} a b" for i in range(REQUESTS)]
    with upstream() as base, recorder(base, out / "prod.parquet", "--workers", "2", logs=tmp_path / "logs") as rec:
        assert "with 2 workers" in rec.stdout.read_text()
        assert _send_all(rec.url, prompts) == [200] * REQUESTS
        os.kill(rec.proc.pid, signal.SIGTERM)  # the parent only: it passes the stop on to its workers
        assert rec.proc.wait(timeout=60) == 0, rec.output
        stdout = rec.stdout.read_text()
    parts = sorted(out.glob("*.parquet"))
    assert [p.name for p in parts] == ["prod-w1-0001.parquet", "prod-w2-0001.parquet"]
    assert all(len(Trace.read(part)) > 0 for part in parts)  # both workers took connections
    assert sorted(_prompts_in(parts)) == sorted(prompts)  # each request exactly once
    assert f"proxied {REQUESTS} requests" in stdout and f"recorded {REQUESTS};" in stdout
    assert f"{REQUESTS} rows in 2 part(s)" in stdout and "incidents: none" in stdout
    assert not list(out.glob("*.segment.jsonl"))


def test_two_workers_kill_9_then_recover(tmp_path: Path) -> None:
    out = tmp_path / "out"
    prompts = [f"k{i} a b" for i in range(REQUESTS)]
    with upstream() as base, recorder(base, out / "prod.parquet", "--workers", "2", logs=tmp_path / "logs") as rec:
        assert _send_all(rec.url, prompts) == [200] * REQUESTS
        time.sleep(1.5)  # rows reach the disk within a second
        rec.kill9()  # the whole process group: parent and both workers
    segments = sorted(p.name for p in out.glob("*.segment.jsonl"))
    assert segments == ["prod-w1-0001.segment.jsonl", "prod-w2-0001.segment.jsonl"]
    result = run_cli("record", "--recover", str(out))
    assert result.returncode == 0, result.stderr
    assert sorted(_prompts_in(sorted(out.glob("*.parquet")))) == sorted(prompts)
    assert not list(out.glob("*.segment.jsonl"))


def test_workers_stop_by_themselves_when_the_parent_is_killed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    prompts = [f"p{i} a b" for i in range(20)]
    with upstream() as base, recorder(base, out / "prod.parquet", "--workers", "2", logs=tmp_path / "logs") as rec:
        assert _send_all(rec.url, prompts) == [200] * 20
        os.kill(rec.proc.pid, signal.SIGKILL)  # the parent alone
        rec.proc.wait(timeout=30)
        deadline = time.monotonic() + 60
        while len(list(out.glob("*.parquet"))) < 2 or list(out.glob("*.segment.jsonl")):
            assert time.monotonic() < deadline, sorted(p.name for p in out.iterdir())
            time.sleep(0.1)
    assert sorted(_prompts_in(sorted(out.glob("*.parquet")))) == sorted(prompts)


def test_workers_share_the_hash_key(tmp_path: Path) -> None:
    """Block ids of one prompt must match across the workers' parts, or prefix sharing is lost between them."""
    out = tmp_path / "out"
    prompt = " ".join(f"word{i}" for i in range(40))  # two full 16-token blocks
    with (
        upstream() as base,
        recorder(base, out / "prod.parquet", "--workers", "2", "--redact", "hash", logs=tmp_path / "logs") as rec,
    ):
        assert _send_all(rec.url, [prompt] * 30) == [200] * 30
        assert rec.stop() == 0, rec.output
    ids = {
        part.name: {tuple(i) for i in Trace.read(part).table.column("prefix_block_ids").to_pylist()}
        for part in sorted(out.glob("*.parquet"))
    }
    assert len(ids) == 2 and len({ids_ for part_ids in ids.values() for ids_ in part_ids}) == 1, ids
    assert len(next(iter(ids["prod-w1-0001.parquet"]))) == 2


def test_a_second_recorder_cannot_join_the_port(tmp_path: Path) -> None:
    with (
        upstream() as base,
        recorder(base, tmp_path / "a" / "prod.parquet", "--workers", "2", logs=tmp_path / "logs") as rec,
    ):
        port = rec.url.rsplit(":", 1)[1]
        second = run_cli(
            "record",
            "--upstream",
            base,
            "--listen",
            f"127.0.0.1:{port}",
            "-o",
            str(tmp_path / "b" / "prod.parquet"),
            "--workers",
            "2",
        )
    assert second.returncode == 2 and second.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}")


@pytest.mark.parametrize("bad", ["0", "65", "many", "-1"])
def test_workers_option_is_checked(bad: str) -> None:
    result = run_cli("record", "--upstream", "http://127.0.0.1:9", "-o", "x.parquet", "--workers", bad)
    assert result.returncode == 2 and result.stderr.startswith("error: --workers must be auto or a number between 1")
    assert result.stderr.count("\n") == 1
