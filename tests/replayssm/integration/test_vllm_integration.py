"""The plugin inside real vllm==0.24.0 (CPU venv from tools/vllm_venv.sh, built once and cached).

Runs vllm_checks.py in that venv with this checkout on PYTHONPATH plus a dist-info holding the entry point
pyproject.toml declares (replayssm_patch.plugin_site, also used on the GPU host), then asserts on its JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from replayssm_patch.plugin_site import plugin_pythonpath

# The first run builds the cached venv (about a minute, longer on a busy machine) inside the fixture.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent


def _run(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{cmd[0]} timed out after {timeout}s: {err[-2000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> dict:
    built = _run(["bash", str(REPO / "tools" / "vllm_venv.sh")], timeout=900)
    assert built.returncode == 0, f"tools/vllm_venv.sh failed: {built.stderr.strip()}"
    venv = Path(built.stdout.strip().splitlines()[-1])
    root = tmp_path_factory.mktemp("vllm")
    models = []
    for name in ("nemotron_h_8b", "nemotron_h_tiny"):
        (root / name).mkdir()
        shutil.copy(HERE / f"{name}_config.json", root / name / "config.json")
        models.append(str(root / name))
    result = root / "result.json"
    env = {**os.environ, "PYTHONPATH": plugin_pythonpath(root / "site"), "VLLM_CACHE_ROOT": str(root / "cache"),
           "VLLM_LOGGING_LEVEL": "WARNING"}  # fmt: skip
    env.pop("VLLM_PLUGINS", None)
    ran = _run([str(venv / "bin" / "python"), str(HERE / "vllm_checks.py"), *models, str(result)], 600, env)
    assert ran.returncode == 0 and result.exists(), f"vllm_checks.py failed:\n{ran.stdout[-3000:]}{ran.stderr[-3000:]}"
    return json.loads(result.read_text())


def test_entry_point_is_declared_and_loads(checks):
    assert checks["entry_point"] == "replayssm_patch:register"
    assert checks["disabled"]["model_class"] == "ReplayNemotronHForCausalLM"  # registered by load_general_plugins


@pytest.mark.parametrize("case", ["disabled", "disabled_after_enabled"])
def test_disabled_is_vllm_exactly(checks, case):
    got = checks[case]
    assert got["model_spec"] == got["stock_spec"] == got["layer_spec"]
    assert got["layer_class"] == "MambaMixer2" and got["layer_is_stock_class"]
    assert got["backend_is_stock"] and got["builder"] == "Mamba2AttentionMetadataBuilder"


def test_enabled_layer_spec_equals_model_classmethods(checks):
    got = checks["enabled"]
    assert got["layer_spec"] == got["model_spec"]
    assert got["layer_class"] == "ReplayMambaMixer2"
    assert got["backend"] == "ReplayMamba2AttentionBackend"
    assert got["builder"] == "ReplayMamba2AttentionMetadataBuilder"


def test_enabled_spec_appends_ring_and_bf16_copy_for_nemotron_h_8b(checks):
    got = checks["enabled"]["model_spec"]
    stock = checks["enabled"]["stock_spec"]
    assert got["shapes"][:2] == stock["shapes"]
    # L=16, 128 heads x 64 head_dim, 8 groups x 128 state; split precision adds the bf16 copy
    assert got["shapes"][2:] == [[16, 128], [16, 128, 64], [16, 8, 128], [128, 64, 128]]
    assert got["dtypes"][2:] == ["torch.float32", "torch.bfloat16", "torch.bfloat16", "torch.bfloat16"]
    extra = 16 * 128 * 4 + 16 * 128 * 64 * 2 + 16 * 8 * 128 * 2 + 128 * 64 * 128 * 2
    assert got["page_size_bytes"] == stock["page_size_bytes"] + extra


def test_enabled_model_builds_replay_layers_everywhere(checks):
    tiny = checks["tiny_model"]
    assert tiny["mixer_classes"] == ["ReplayMambaMixer2"] and tiny["mixers"] == 2  # pattern "M*M"


def test_real_builder_plans_capture_decode_and_prefill(checks):
    steps = checks["tiny_model"]["steps"]
    assert steps[0] == {"capture_write_pos": [0, 0], "table_allocated": False}  # capture touched no cursor
    assert [s["write_pos"] for s in steps[1:6]] == [[0, 0], [1, 1], [2, 2], [3, 3], [0, 0]]  # L=4
    assert [s["flush_len"] for s in steps[1:6]] == [[0, 0], [0, 0], [0, 0], [4, 4], [0, 0]]
    # decode row (block 3) has 1 entry to fold; the fresh prompt in reused block 6 reads none of its 2 stale
    assert steps[6] == {"decodes": 1, "prefills": 1, "pending": [1, 0], "after": [0, 0, 0, 0, 0, 1, 0, 0]}


def test_prefix_caching_is_refused_from_a_real_config(checks):
    refused = checks["tiny_model"]["refused_prefix_caching"]
    assert refused.startswith("ReplaySSMRefused: ReplaySSM refused: mamba prefix caching mode 'all'")


def test_main_venv_stays_free_of_vllm():
    """The plugin's vLLM-free parts import without vLLM (register() is only called by vLLM)."""
    code = "import replayssm_patch, replayssm_patch.config, replayssm_patch.cursors, replayssm_patch.refusals"
    code += ", replayssm_patch.state_layout"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
