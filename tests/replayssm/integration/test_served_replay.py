"""The served-model check of tools/gpu/onegpu.sh `moe`: real replays (the embedded engine serving the
qwen3.5-35b-a3b shape with the replayssm policy; the test upstream failing some requests), then the check's JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from replayssm_patch.gpu.served_replay import PLUGIN_LINE, main
from tests.experiment.support import tiny_trace
from tests.sim.support import start_sim
from tests.support.openai_server import upstream

REPO = Path(__file__).resolve().parents[3]
REQUESTS, OUTPUT_TOKENS = 6, 8
LOG = f"""INFO 12-01 10:00:00 [gdn_mixer.py] {PLUGIN_LINE}: QwenGatedDeltaNetAttention layers replaced (buffer_len=16)
INFO 12-01 10:01:10 [kv_cache_utils.py:2146] GPU KV cache size: 1,234,567 tokens
INFO 12-01 10:01:10 [kv_cache_utils.py:2148] Maximum concurrency for 8,192 tokens per request: 150.70x
"""


def replay(url: str, tmp_path: Path) -> Path:
    trace = tiny_trace(tmp_path / "trace.parquet", requests=REQUESTS, output_tokens=OUTPUT_TOKENS)
    result = tmp_path / "result.parquet"
    done = subprocess.run(
        [sys.executable, "-m", "harness", "replay", str(trace), "--url", url, "-o", str(result)],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=os.environ,
    )  # fmt: skip
    assert result.exists(), done.stdout + done.stderr
    return result


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text((REPO / "configs/models/qwen3.5-35b-a3b.json").read_text())
    return tmp_path / "model"


def check(result: Path, model_dir: Path, out: Path, *extra: str) -> tuple[int, dict]:
    code = main([str(result), "--model-dir", str(model_dir), "--variant", "replayssm_fp32", "--out", str(out), *extra])
    return code, json.loads(out.read_text())


def test_a_whole_exact_replay_with_the_plugin_active_passes(tmp_path, model_dir, capsys):
    sim = start_sim("--model-config", "qwen3.5-35b-a3b", "--policy", "replayssm")
    try:
        result = replay(sim.url, tmp_path)
    finally:
        sim.stop()
    (tmp_path / "server.log").write_text(LOG)
    code, document = check(result, model_dir, tmp_path / "served.json", "--server-log", str(tmp_path / "server.log"))
    assert code == 0 and document["passed"] and document["problems"] == []
    assert (document["requests"], document["succeeded"], document["exact_lengths"]) == (REQUESTS,) * 3
    assert document["output_tokens"] == REQUESTS * OUTPUT_TOKENS and document["failures"] == {}
    assert document["model"]["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    assert document["server"]["replayssm"].endswith("layers replaced (buffer_len=16)")
    assert (document["server"]["kv_cache_tokens"], document["server"]["max_concurrency"]) == (1234567.0, 150.7)
    assert document["tpot_p50_ms"] > 0 and document["ttft_p99_ms"] >= document["ttft_p50_ms"]
    assert capsys.readouterr().out.startswith("served replayssm_fp32 default Qwen3_5MoeForConditionalGeneration: PASS")
    # the same replay without the plugin's line: the server ran vLLM's own layers
    code, document = check(result, model_dir, tmp_path / "no-plugin.json")
    assert code == 1 and document["problems"] == [
        f"no '{PLUGIN_LINE}' line in the server log: the plugin did not replace the layers"
    ]


def test_failed_requests_fail_the_check(tmp_path, model_dir):
    with upstream(mode="500", fault_every=3) as url:
        result = replay(url, tmp_path)
    (tmp_path / "server.log").write_text(LOG)
    code, document = check(result, model_dir, tmp_path / "served.json", "--server-log", str(tmp_path / "server.log"))
    failed = REQUESTS // 3  # arrivals 0 and 3
    assert code == 1 and document["succeeded"] == REQUESTS - failed == document["exact_lengths"]
    assert sum(document["failures"].values()) == failed
    assert document["problems"][0].startswith(f"{failed} request(s) failed")


def test_missing_result_is_one_line(tmp_path, model_dir, capsys):
    code = main([str(tmp_path / "none.parquet"), "--model-dir", str(model_dir), "--variant", "baseline",
                 "--out", str(tmp_path / "x.json")])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 2 and out.count("\n") == 1 and "none.parquet: no such result file" in out
