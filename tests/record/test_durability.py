"""Crashes and full disks: kill -9 under load then --recover; write failures counted while proxying goes on."""

from __future__ import annotations

import asyncio
import re
import resource
import time
from pathlib import Path

import aiohttp

from harness.trace.model import Trace
from tests.record.recorder_process import recorder, run_cli
from tests.record.traffic import completion_body, encode, fetch_all
from tests.support.openai_server import upstream

CLIENTS = 16


async def _load(url: str, finished: dict[str, float], stop: asyncio.Event) -> None:
    """CLIENTS loops of streaming requests with unique prompts; note when each one finished (monotonic)."""
    counter = iter(range(1_000_000))

    async def client(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            prompt = f"req{next(counter)} a b c"
            body = encode(completion_body(prompt, 20, stream=True, ignore_eos=True))
            try:
                async with session.post(f"{url}/v1/completions", data=body) as response:
                    body = await response.read()
            except aiohttp.ClientError:
                await asyncio.sleep(0.01)
                continue
            if body.endswith(b"data: [DONE]\n\n"):
                finished[prompt] = time.monotonic()

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(CLIENTS)))


def test_kill_9_under_load_then_recover(tmp_path: Path) -> None:
    out = tmp_path / "out"
    finished: dict[str, float] = {}
    with upstream(token_delay=0.005) as base, recorder(base, out / "prod.parquet", logs=tmp_path) as rec:

        async def drive() -> float:
            stop = asyncio.Event()
            load = asyncio.create_task(_load(rec.url, finished, stop))
            await asyncio.sleep(3.0)
            killed_at = time.monotonic()
            rec.kill9()  # mid-stream: 16 streams are in flight
            stop.set()
            await load
            return killed_at

        killed_at = asyncio.run(drive())
    assert len(list(out.glob("*.segment.jsonl"))) == 1 and not list(out.glob("*.parquet"))
    result = run_cli("record", "--recover", str(out))
    assert result.returncode == 0, result.stderr
    assert "prod-0001.segment.jsonl -> " in result.stdout
    assert not list(out.glob("*.segment.jsonl"))
    trace = Trace.read(out / "prod-0001.parquet")
    prompts = [p.split()[0] for p in trace.table.column("prompt").to_pylist()]
    must_have = {p.split()[0] for p, t in finished.items() if t < killed_at - 1.0}
    assert len(must_have) > 20
    assert must_have <= set(prompts), sorted(must_have - set(prompts))
    assert len(prompts) == len(set(prompts))  # no duplicates, nothing invented
    assert set(prompts) <= {p.split()[0] for p in finished} | {f"req{i}" for i in range(len(finished) + CLIENTS)}
    assert set(trace.table.column("output_tokens").to_pylist()) == {20}
    again = run_cli("record", "--recover", str(out))
    assert again.returncode == 0 and "no segments to recover" in again.stdout


def _small_file_limit() -> None:
    """In the recorder's process only: files may not grow past 4000 bytes (writes then fail like a full disk)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (4000, 4000))


def test_disk_full_counts_losses_and_keeps_proxying(tmp_path: Path) -> None:
    out = tmp_path / "out"
    requests = [("POST", "/v1/completions", encode(completion_body(f"p{i} " + "w " * 30, 2))) for i in range(12)]
    with (
        upstream() as base,
        recorder(base, out / "prod.parquet", logs=tmp_path / "logs", preexec=_small_file_limit) as rec,
    ):
        answers = fetch_all(requests, rec.url)
        assert [a.status for a in answers] == [200] * 12  # proxying never stops
        assert rec.stop() == 1  # rows were lost: the exit code says so
        stderr, stdout = rec.stderr.read_text(), rec.stdout.read_text()
    append_errors = [line for line in stderr.splitlines() if line.startswith("error: cannot append")]
    assert len(append_errors) == 1 and "File too large" in append_errors[0]  # one line, not one per request
    recorded = int(re.search(r"recorded (\d+);", stdout).group(1))  # type: ignore[union-attr]
    lost = int(re.search(r"rows lost to write errors: (\d+)", stdout).group(1))  # type: ignore[union-attr]
    assert recorded + lost == 12 and 0 < recorded < 12
    assert "kept segment" in stdout  # the Parquet part did not fit either: the segment stays for --recover
    result = run_cli("record", "--recover", str(out))
    assert result.returncode == 0, result.stderr
    assert len(Trace.read(out / "prod-0001.parquet")) == recorded
    assert "1 torn line(s) skipped" in result.stdout  # the row cut off by the full disk


def test_unwritable_output_path_proxies_and_counts(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    requests = [("POST", "/v1/completions", encode(completion_body(f"p{i}", 2))) for i in range(3)]
    with upstream() as base, recorder(base, blocker / "sub" / "prod.parquet", logs=tmp_path / "logs") as rec:
        assert [a.status for a in fetch_all(requests, rec.url)] == [200] * 3
        assert rec.stop() == 1
        stderr, stdout = rec.stderr.read_text(), rec.stdout.read_text()
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Not a directory" in errors[0] and "writable -o path" in errors[0]
    assert "rows lost to write errors: 3" in stdout and "Traceback" not in stderr
