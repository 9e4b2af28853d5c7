"""Property-based tests of the parsers: valid rows round-trip exactly; garbage only ever raises `UserError`."""

from __future__ import annotations

import datetime as dt
import json
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.errors import UserError
from harness.trace.importers import IMPORTERS, import_trace

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
START = dt.datetime(2023, 11, 16, 18, 15, 46)
tokens = st.integers(min_value=0, max_value=2**31 - 1)


def in_temp_file(name: str, data: bytes, fn):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        return fn(path)


@SETTINGS
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=10**13), tokens, tokens), min_size=1, max_size=40))
def test_random_azure_rows_round_trip(rows):
    """Offsets in units of 100 ns (the source's 7 fractional digits), in any order, with any token counts."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for ticks, prompt, output in rows:
        stamp = START + dt.timedelta(microseconds=ticks // 10)
        lines.append(f"{stamp:%Y-%m-%d %H:%M:%S}.{stamp.microsecond:06d}{ticks % 10},{prompt},{output}")
    trace = in_temp_file("t.csv", "\n".join(lines).encode(), lambda p: import_trace("azure", p).trace)
    ticks = np.array([r[0] for r in rows])
    order = np.argsort(ticks, kind="stable")
    assert trace.table.column("prompt_tokens").to_pylist() == [rows[i][1] for i in order]
    assert trace.table.column("output_tokens").to_pylist() == [rows[i][2] for i in order]
    expected = (ticks[order] - ticks[order][0]) * 1e-7
    np.testing.assert_allclose(trace.arrivals.to_numpy(), expected, rtol=0, atol=1e-9)
    assert trace.table.column("request_id").to_pylist() == [f"azure-t-{i:06d}" for i in order]


length_rows = st.lists(
    st.fixed_dictionaries(
        {
            "timestamp": st.integers(min_value=0, max_value=10**9),
            "input_length": tokens,
            "output_length": tokens,
            "hash_ids": st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=6),
        }
    ),
    min_size=1,
    max_size=30,
)


@SETTINGS
@given(length_rows)
def test_random_mooncake_rows_round_trip(rows):
    data = "\n".join(json.dumps(r) for r in rows).encode()
    trace = in_temp_file("m.jsonl", data, lambda p: import_trace("mooncake", p).trace)
    order = np.argsort([r["timestamp"] for r in rows], kind="stable")
    ordered = [rows[i] for i in order]
    assert trace.table.column("prefix_block_ids").to_pylist() == [r["hash_ids"] for r in ordered]
    assert trace.table.column("prompt_tokens").to_pylist() == [r["input_length"] for r in ordered]
    first = ordered[0]["timestamp"]
    assert trace.arrivals.to_pylist() == [(r["timestamp"] - first) / 1000 for r in ordered]


# any character, unpaired surrogates included (JSON can escape them in)
short_text = st.text(alphabet=st.characters(exclude_categories=()), max_size=8)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | short_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(short_text, children, max_size=4),
    max_leaves=12,
)
near_valid_objects = st.fixed_dictionaries(
    {},
    optional={
        "timestamp": json_values,
        "input_length": json_values,
        "output_length": json_values,
        "hash_ids": json_values,
        "prompt": json_values,
        "messages": json_values,
        "max_tokens": json_values,
        "body": json_values,
        "usage": json_values,
        "url": json_values,
        "model": json_values,
    },
)


def only_user_errors(fmt: str, name: str, data: bytes) -> None:
    try:
        in_temp_file(name, data, lambda p: import_trace(fmt, p))
    except UserError as error:
        assert "\n" not in str(error), str(error)


@SETTINGS
@given(st.sampled_from(sorted(IMPORTERS)), st.binary(max_size=300))
def test_random_bytes_never_raise_anything_but_user_error(fmt, data):
    only_user_errors(fmt, "garbage.txt", data)


@SETTINGS
@given(
    st.sampled_from(["mooncake", "vllm-timed", "openai-jsonl"]), st.lists(near_valid_objects, min_size=1, max_size=4)
)
def test_random_json_objects_never_raise_anything_but_user_error(fmt, objects):
    only_user_errors(fmt, "objects.jsonl", "\n".join(json.dumps(o) for o in objects).encode())


csv_cells = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12)


@SETTINGS
@given(st.sampled_from(["azure", "burstgpt"]), st.lists(st.lists(csv_cells, min_size=1, max_size=8), max_size=5))
def test_random_csv_bodies_under_a_valid_header_never_raise_anything_but_user_error(fmt, rows):
    header = (
        "TIMESTAMP,ContextTokens,GeneratedTokens"
        if fmt == "azure"
        else "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type"
    )
    body = "\n".join([header, *(",".join(r) for r in rows)])
    only_user_errors(fmt, "cells.csv", body.encode())


@SETTINGS
@given(
    st.sampled_from(["azure", "burstgpt"]),
    st.lists(st.lists(csv_cells, min_size=1, max_size=4), min_size=1, max_size=4),
)
def test_random_csv_headers_and_bodies_never_raise_anything_but_user_error(fmt, rows):
    only_user_errors(fmt, "any.csv", "\n".join(",".join(r) for r in rows).encode())


@SETTINGS
@given(
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=10**8), tokens, tokens, st.sampled_from(["ChatGPT", "GPT-4"])),
        min_size=1,
        max_size=30,
    )
)
def test_random_burstgpt_rows_round_trip(rows):
    lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    lines += [f"{t},{model},{p},{o},{p + o},API log" for t, p, o, model in rows]
    result = in_temp_file("b.csv", "\n".join(lines).encode(), lambda p: import_trace("burstgpt", p))
    order = np.argsort([r[0] for r in rows], kind="stable")
    ordered = [rows[i] for i in order]
    table = result.trace.table
    assert table.column("output_tokens").to_pylist() == [r[2] for r in ordered]
    assert table.column("model").to_pylist() == [r[3] for r in ordered]
    assert result.trace.arrivals.to_pylist() == [float(r[0] - ordered[0][0]) for r in ordered]
    assert result.failed_rows == sum(r[2] == 0 for r in rows)


request_text = st.text(max_size=40)


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=1e9, allow_nan=False),
            st.booleans(),
            request_text,
            st.integers(min_value=0, max_value=4096),
            st.floats(min_value=0, max_value=2, allow_nan=False),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_random_openai_requests_round_trip(requests):
    lines = []
    for stamp, chat, text, max_tokens, temperature in requests:
        body = {"model": "m", "max_tokens": max_tokens, "temperature": temperature}
        body |= {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}
        lines.append(json.dumps({"timestamp": stamp, "body": body}))
    trace = in_temp_file("o.jsonl", "\n".join(lines).encode(), lambda p: import_trace("openai-jsonl", p).trace)
    order = np.argsort([r[0] for r in requests], kind="stable")
    rows = trace.table.to_pylist()
    for row, i in zip(rows, order, strict=True):
        stamp, chat, text, max_tokens, temperature = requests[i]
        assert row["api"] == ("chat" if chat else "completions")
        content = json.loads(row["messages"])[0]["content"] if chat else row["prompt"]
        assert content == text
        assert row["output_tokens"] == max_tokens
        assert json.loads(row["params"]) == {"max_tokens": max_tokens, "temperature": temperature}
