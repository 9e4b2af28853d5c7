"""The decode-pace benchmark: its trace, its window arithmetic, and its GPU entry point run end to end against
the embedded engine (`serve-sim`) with tiny sizes, compared with an engine-step file as engine_step.py writes."""

import json

import numpy as np
import pytest

from bench.bench_decode_pace import engine_spec, true_step_ms, true_tpot_ms
from bench.decode_pace import (
    ROW_KEY,
    ClientPace,
    case_row,
    client_pace,
    decode_window,
    main,
    pace_trace,
)
from replayssm_patch.gpu.engine_step import WHAT as ENGINE_WHAT
from replayssm_patch.gpu.row_file import record_row
from tests.sim.support import start_sim


def test_trace_sends_every_stream_at_once_and_leaves_the_prompts_to_the_replay():
    trace = pace_trace(3, prompt_tokens=40, output_tokens=7).table.to_pylist()
    assert [r["arrival_s"] for r in trace] == [0.0, 0.0, 0.0]
    assert {r["output_tokens"] for r in trace} == {7} and {r["prompt_tokens"] for r in trace} == {40}
    assert {r["prompt"] for r in trace} == {None} and json.loads(trace[0]["params"]) == {"temperature": 0}


def test_window_runs_from_the_last_first_token_to_the_first_last_token():
    """Stream a is sent at 0 and streams 1 token each 10 ms from 0.1 s; b is sent at 0.05 s, its first token
    arrives at 0.13 s; the window (0.13, 0.2] holds 7 tokens of a and 7 of b (b's: 0.14 .. 0.20)."""
    a = [0.1 + 0.01 * k for k in range(11)]  # last at 0.2
    b = [0.08 + 0.01 * k for k in range(12)]  # sent at 0.05: 0.13 .. 0.24
    window, tokens = decode_window([0.0, 0.05], [a, b], None)
    assert window == pytest.approx(0.07) and tokens == 7.0
    # chunks of several tokens (the result's token_counts): each chunk adds its count
    window, tokens = decode_window([0.0, 0.0], [[0.1, 0.2, 0.3], [0.1, 0.2, 0.3]], [[1, 2, 2], [1, 4, 0]])
    assert window == pytest.approx(0.2) and tokens == pytest.approx((4 + 4) / 2)
    assert decode_window([0.0, 0.0], [[0.1, 0.2], [0.3, 0.4]], None) == (None, None)  # a finished before b began


def test_virtual_truth_of_one_stream_is_its_own_decode_step():
    """One stream never shares a step: its TPOT and the two-length step are the same decode step."""
    spec = engine_spec()
    assert true_step_ms(spec, 1, 64, 32) == pytest.approx(true_tpot_ms(spec, 1, 64, 32), rel=1e-3)
    # 32 x 1024 prompt tokens take 4 steps of 8192: the first streams decode beside the others' prefill
    assert true_tpot_ms(spec, 32, 1024, 32) > 1.2 * true_step_ms(spec, 32, 1024, 32)


def test_case_row_compares_tpot_only_with_an_engine_tpot_of_the_same_length():
    pace = ClientPace(64, 0, 64, 64, 22.0, 21.0, 10.5, 2.0, 190.0, 3.0, False, "one per streamed chunk")
    engine = {"step_ms": 10.0, "engine_tpot_ms": 20.0, "engine_tpot_tokens": 272}
    row = case_row("baseline", "O0", 64, 1, pace, engine, output_tokens=256)
    assert (row["window_vs_engine"], row["tpot_vs_engine_step"], row["engine_tpot_ms"]) == (1.05, 2.2, None)
    row = case_row("baseline", "O0", 64, 1, pace, engine, output_tokens=272)
    assert row["tpot_vs_engine_tpot"] == 1.1
    assert case_row("baseline", "O0", 64, 1, pace, None, 256)["window_vs_engine"] is None
    assert row["engine_step_clock"] == "t272-t16"


def test_case_row_prefers_the_engine_rows_decode_window():
    """An engine row measured with its decode window is compared by that step (no prefill jitter in it)."""
    pace = ClientPace(64, 0, 64, 64, 22.0, 21.0, 10.5, 2.0, 190.0, 3.0, False, "one per streamed chunk")
    row = case_row("baseline", "O0", 64, 1, pace, {"step_ms": 10.0, "window_step_ms": 10.5}, output_tokens=256)
    assert (row["engine_step_ms"], row["engine_step_clock"], row["window_vs_engine"]) == (10.5, "window", 1.0)


def test_gpu_entry_point_against_serve_sim(tmp_path, capsys):
    """`python -m bench.decode_pace` as the H200 run calls it, against a real server on loopback: every case is
    replayed, counted exactly, compared with the engine-step file's row, and merged into --out."""
    engine = tmp_path / "engine_step.json"
    record_row(engine, {"variant": "baseline", "mode": "O0", "batch": 4, "step_ms": 5.0}, ENGINE_WHAT, "c", {})
    out = tmp_path / "pace.json"
    sim = start_sim("--max-num-seqs", "8")
    try:
        argv = ["--url", sim.url, "--streams", "1,4", "--workers", "1,2", "--prompt-tokens", "32",
                "--output-tokens", "12", "--engine-step", str(engine), "--out", str(out)]  # fmt: skip
        assert main(argv) == 0
    finally:
        sim.stop()
    saved = json.loads(out.read_text())
    rows = saved["rows"]
    assert [(r["batch"], r["workers"]) for r in rows] == [(1, 1), (1, 2), (4, 1), (4, 2)]
    assert set(ROW_KEY) <= set(rows[0]) and saved["command"].startswith("python3 -m bench.decode_pace --url")
    for r in rows:
        assert (r["requests"], r["errors"], r["exact"], r["prompt_exact"]) == (r["batch"], 0, r["batch"], r["batch"])
        assert r["tpot_mean_ms"] > 0 and r["window_step_ms"] > 0 and r["window_tokens"] > 0
    four = rows[2]
    assert four["engine_step_ms"] == 5.0 and four["window_vs_engine"] == round(four["window_step_ms"] / 5.0, 4)
    assert rows[0]["engine_step_ms"] is None  # no engine row at batch 1
    runs = out.parent / "pace-runs"
    assert (runs / "baseline-O0-c4-w2.trace.parquet").exists()
    again = client_pace(runs / "baseline-O0-c4-w2.parquet")
    assert again.window_step_ms == rows[3]["window_step_ms"]  # the row is what the kept result file says
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and "streams 4 workers 1" in lines[2] and "(" in lines[2]
    assert np.isfinite(four["tpot_p50_ms"])


def test_bad_engine_step_file_is_one_line_and_exit_2(tmp_path, capsys):
    argv = ["--url", "http://127.0.0.1:9", "--engine-step", str(tmp_path / "none.json"), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and "no such file" in out and "engine_step.py" in out
