"""The GPU serve check's CPU-side parts: the server command per variant and mode, vLLM log facts, the report,
its bad-input exit, and its serving check against a real OpenAI-compatible server (the embedded engine)."""

import json
from pathlib import Path

from replayssm_patch.gpu.serve_check import (
    ServeResult,
    VariantResult,
    last_log_line,
    log_facts,
    main,
    serve_streams,
    server_command,
    write_report,
)
from tests.sim.support import start_sim

LOG = """INFO 11-30 08:00:01 [interface.py:774] Setting attention block size to 1040 tokens to ensure that ...
INFO 11-30 08:01:10 [kv_cache_utils.py:2146] GPU KV cache size: 2,633,728 tokens
INFO 11-30 08:01:10 [kv_cache_utils.py:2148] Maximum concurrency for 4,096 tokens per request: 643.00x
"""


def test_server_command_carries_the_variants_knob_and_the_modes_flags():
    o0 = server_command(Path("/m"), 8011, "replayssm_split", "O0")
    assert o0[o0.index("--additional-config") + 1] == (
        '{"replayssm": {"enable": true, "buffer_len": 16, "split_precision": true}}'
    )
    assert o0[o0.index("-O0") + 1 : o0.index("-O0") + 3] == ["-cc", '{"cudagraph_mode":"FULL_DECODE_ONLY"}']
    default = server_command(Path("/m"), 8011, "baseline", "default")
    assert "-O0" not in default and "-cc" not in default and "--additional-config" not in default
    assert default[default.index("--mamba-ssm-cache-dtype") + 1] == "float32"


def test_log_facts_reads_vllm_capacity_lines(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(LOG)
    assert log_facts(log) == {"kv_cache_tokens": 2633728.0, "max_concurrency": 643.0, "attention_block_size": 1040.0}


def test_last_log_line_prefers_the_refusal(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("ERROR x ReplaySSM refused: the V2 model runner is not supported\nTraceback ...\nRuntimeError\n")
    assert "ReplaySSM refused" in last_log_line(log)


def test_report_lists_start_up_capacity_and_whole_answers(tmp_path):
    results = [
        VariantResult("baseline", "default", 150.0, {"kv_cache_tokens": 100.0}, [ServeResult(64, 64, 0, 64)]),
        VariantResult("replayssm_fp32", "default", 160.0, {}, [ServeResult(64, 64, 1, 62)]),
        VariantResult("replayssm_split", "default", error="server not healthy after 200s: ReplaySSM refused: x"),
    ]
    write_report(tmp_path, results)
    md = (tmp_path / "serve_check.md").read_text()
    assert "| baseline | default | 150.0 | 100.0 | None | 64 | 0 | 64/64 |" in md
    assert "| replayssm_fp32 | default | 160.0 | None | None | 64 | 1 | 62/64 |" in md
    assert "error: server not healthy after 200s: ReplaySSM refused: x" in md
    assert "ITL" not in md and "speed-up" not in md  # step figures come from engine_step.py / decode_pace.py
    saved = json.loads((tmp_path / "serve_check.json").read_text())
    assert [r["name"] for r in saved] == ["baseline", "replayssm_fp32", "replayssm_split"]
    assert saved[1]["serves"][0] == {"streams": 64, "requests": 64, "errors": 1, "exact_lengths": 62}


def test_missing_tokenizer_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    assert main(["--model", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and "make-tokenizer.py" in out


def test_serving_check_counts_whole_answers_through_the_replay_path(tmp_path):
    """Against the embedded engine on loopback: 3 streams of prompt 1024 / exactly 256 tokens all come back."""
    sim = start_sim("--max-num-seqs", "8")
    try:
        got = serve_streams(sim.url, 3, tmp_path / "runs", "baseline")
    finally:
        sim.stop()
    assert got == ServeResult(streams=3, requests=3, errors=0, exact_lengths=3)
    assert (tmp_path / "runs" / "baseline-c3.parquet").exists()
