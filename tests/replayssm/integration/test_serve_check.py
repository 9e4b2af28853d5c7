"""The GPU serve check's CPU-side parts: vLLM log facts, the report, and its bad-input exit."""

import json

from replayssm_patch.gpu.serve_check import (
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    LoadResult,
    VariantResult,
    last_log_line,
    log_facts,
    main,
    prompt_of,
    write_report,
)
from tests.sim.support import start_sim

LOG = """INFO 11-30 08:00:01 [interface.py:774] Setting attention block size to 1040 tokens to ensure that ...
INFO 11-30 08:01:10 [kv_cache_utils.py:2146] GPU KV cache size: 2,633,728 tokens
INFO 11-30 08:01:10 [kv_cache_utils.py:2148] Maximum concurrency for 4,096 tokens per request: 643.00x
"""


def test_log_facts_reads_vllm_capacity_lines(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(LOG)
    assert log_facts(log) == {"kv_cache_tokens": 2633728.0, "max_concurrency": 643.0, "attention_block_size": 1040.0}


def test_last_log_line_prefers_the_refusal(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("ERROR x ReplaySSM refused: the V2 model runner is not supported\nTraceback ...\nRuntimeError\n")
    assert "ReplaySSM refused" in last_log_line(log)


def test_prompt_has_exactly_the_prompt_tokens_and_differs_per_stream():
    assert len(prompt_of(0).split()) == PROMPT_TOKENS
    assert prompt_of(0) != prompt_of(1)


def _load(concurrency, itl):
    return LoadResult(concurrency, concurrency, 0, concurrency, itl, itl * 2, 1000.0, 10.0)


def test_report_has_speedup_over_baseline_and_errors(tmp_path):
    results = [
        VariantResult("baseline_fp32", None, 150.0, {"kv_cache_tokens": 100.0}, [_load(256, 24.0)]),
        VariantResult("replayssm_fp32", {"replayssm": {"enable": True}}, 160.0, {}, [_load(256, 16.0)]),
        VariantResult("replayssm_split", {}, error="server not healthy after 200s: ReplaySSM refused: x"),
    ]
    write_report(tmp_path, results)
    md = (tmp_path / "serve_check.md").read_text()
    assert "| replayssm_fp32 | 160.0 | None | None | 256 | 16.0 | 1.50x |" in md
    assert "| baseline_fp32 | 150.0 | 100.0 | None | 256 | 24.0 | 1.00x |" in md
    assert "error: server not healthy after 200s: ReplaySSM refused: x" in md
    saved = json.loads((tmp_path / "serve_check.json").read_text())
    assert [r["name"] for r in saved] == ["baseline_fp32", "replayssm_fp32", "replayssm_split"]
    assert saved[1]["loads"][0]["exact_lengths"] == 256 and OUTPUT_TOKENS == 256


def test_missing_tokenizer_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    assert main(["--model", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and "make-tokenizer.py" in out


def test_attach_measures_a_running_server_and_adds_to_the_report(tmp_path):
    """--attach against a real OpenAI-compatible server on loopback (the embedded engine): exact lengths and
    ITLs land in the report beside an earlier result, and the reference variant gives the speed-up."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    out = tmp_path / "out"
    out.mkdir()
    write_report(out, [VariantResult("baseline_fp32", None, 150.0, {}, [_load(2, 40.0)])])
    log = tmp_path / "server.log"
    log.write_text(LOG)
    sim = start_sim("--max-num-seqs", "8")
    try:
        port = int(sim.url.rsplit(":", 1)[1])
        code = main(["--model", str(model), "--out", str(out), "--attach", str(port), "--name", "candidate",
                     "--log", str(log), "--concurrency", "2"])  # fmt: skip
    finally:
        sim.stop()
    assert code == 0
    saved = {r["name"]: r for r in json.loads((out / "serve_check.json").read_text())}
    assert set(saved) == {"baseline_fp32", "candidate"}
    load = saved["candidate"]["loads"][0]
    assert (load["concurrency"], load["errors"], load["exact_lengths"]) == (2, 0, 2)
    assert load["itl_p50_ms"] > 0
    assert saved["candidate"]["facts"]["max_concurrency"] == 643.0
    assert f"{40.0 / load['itl_p50_ms']:.2f}x" in (out / "serve_check.md").read_text()


def test_attach_without_name_or_log_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["--model", str(tmp_path), "--out", str(tmp_path / "out"), "--attach", "8000"]) == 2
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and "--name" in out and "--log" in out
