"""Redaction modes keep what they promise, and credentials reach no file the recorder writes, in any mode."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from harness.trace.model import Trace
from tests.record.recorder_process import recorder
from tests.record.traffic import chat_body, completion_body, encode, fetch_all
from tests.support.openai_server import upstream

COMMON = " ".join(f"common{i}" for i in range(40))  # 40 shared words = 2 full 16-token blocks + 8 tokens
PROMPT_A = COMMON + " " + " ".join(f"zebracorn{i}" for i in range(10))
PROMPT_B = COMMON + " " + " ".join(f"other{i}" for i in range(10))


@dataclass
class Recorded:
    trace: Trace
    secrets: list[str]
    files: dict[Path, bytes]  # every file the recorder wrote, incl. the live segment and its logs


def _files(directory: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def _record(tmp: Path, mode: str) -> Recorded:
    key = "sk-test-" + secrets.token_hex(20)
    header_key = "hdr-" + secrets.token_hex(12)
    cookie = "ck-" + secrets.token_hex(12)
    password = "pw-" + secrets.token_hex(12)
    headers = {
        "Authorization": f"Bearer {key}",
        "api-key": header_key,
        "Cookie": f"session={cookie}",
        "Content-Type": "application/json",
        "X-Session-Id": "sess-1",
        "X-Tenant-Id": "acme",
    }
    with_secrets = {
        "api_key": key,
        "password": password,
        "metadata": {"token": key, "note": "n"},
        "user": key,
        "temperature": 0.25,
    }
    requests = [
        ("POST", "/v1/completions", encode(completion_body(PROMPT_A, 3, stream=True, **with_secrets))),
        ("POST", "/v1/completions", encode(completion_body(PROMPT_B, 4, **with_secrets))),
        ("POST", "/v1/chat/completions", encode(chat_body(f"zebracorn question {key}", 2, **with_secrets))),
    ]
    out = tmp / "out"
    with upstream() as base, recorder(base, out / "t.parquet", "--redact", mode, logs=out / "logs") as rec:
        answers = fetch_all(requests, rec.url, headers)
        assert [a.status for a in answers] == [200, 200, 200]
        time.sleep(1.5)  # the rows are fsync'ed within a second: look at the live segment too
        files = _files(out)
        assert any(p.name.endswith(".segment.jsonl") for p in files)
        assert rec.stop() == 0
    files |= _files(out)
    trace = Trace.read(out / "t-0001.parquet")
    files[Path("decoded-parquet")] = json.dumps(trace.table.to_pylist()).encode()
    files[Path("parquet-metadata")] = json.dumps(trace.metadata).encode()
    return Recorded(trace, [key, header_key, cookie, password], files)


@pytest.fixture(scope="module", params=["none", "hash", "drop"])
def recorded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Recorded]:
    return request.param, _record(tmp_path_factory.mktemp(f"redact-{request.param}"), request.param)


def test_no_credential_in_any_file(recorded: tuple[str, Recorded]) -> None:
    _, result = recorded
    assert len(result.files) >= 5  # segment, parquet, stdout, stderr, decoded views
    for path, content in result.files.items():
        for secret in result.secrets:
            assert secret.encode() not in content, f"{secret} found in {path}"


def test_parquet_is_compressed_so_decoded_view_is_what_matters(recorded: tuple[str, Recorded]) -> None:
    _, result = recorded
    part = next(p for p in result.files if p.name == "t-0001.parquet")
    assert pq.read_metadata(part).row_group(0).column(0).compression == "ZSTD"


def test_counts_and_ids_kept_in_every_mode(recorded: tuple[str, Recorded]) -> None:
    _, result = recorded
    rows = result.trace.table.to_pylist()
    assert [r["prompt_tokens"] for r in rows] == [50, 50, 3 + 2]
    assert [r["output_tokens"] for r in rows] == [3, 4, 2]
    assert {(r["session_id"], r["tenant"]) for r in rows} == {("sess-1", "acme")}
    assert result.trace.metadata["redaction"] == recorded[0]


def test_mode_specific_content(recorded: tuple[str, Recorded]) -> None:
    mode, result = recorded
    rows = result.trace.table.to_pylist()
    text = result.files[Path("decoded-parquet")]
    params = [json.loads(r["params"]) for r in rows]
    if mode == "none":
        assert rows[0]["prompt"] == PROMPT_A
        assert json.loads(rows[2]["messages"])[0]["content"] == "zebracorn question [redacted]"
        assert params[1] == {"max_tokens": 4, "metadata": {"note": "n"}, "user": "[redacted]", "temperature": 0.25}
        assert all(r["prefix_block_ids"] is None for r in rows)
        return
    assert b"zebracorn" not in text and b"common1" not in text  # no prompt text anywhere
    assert all(r["prompt"] is None and r["messages"] is None for r in rows)
    assert params[1] == {"max_tokens": 4, "temperature": 0.25}
    if mode == "drop":
        assert all(r["prefix_block_ids"] is None for r in rows)
        assert "tokenizer" not in result.trace.metadata
        return
    a, b, chat = (r["prefix_block_ids"] for r in rows)
    assert len(a) == len(b) == 3 and a[:2] == b[:2] and a[2] != b[2]
    assert chat == []  # 5 tokens: no full block
    assert "/tokenize" in result.trace.metadata["tokenizer"] and result.trace.metadata["block_size"] == "16"
