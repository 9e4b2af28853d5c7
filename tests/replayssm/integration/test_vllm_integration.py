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
def vllm_python() -> Path:
    built = _run(["bash", str(REPO / "tools" / "vllm_venv.sh")], timeout=900)
    assert built.returncode == 0, f"tools/vllm_venv.sh failed: {built.stderr.strip()}"
    return Path(built.stdout.strip().splitlines()[-1]) / "bin" / "python"


def _run_check(python: Path, root: Path, script: str, configs: list[str], **env_extra: str) -> dict:
    """Run ``script`` in the vllm venv on model dirs made from ``configs``; return the JSON it writes."""
    models = []
    for name in configs:
        (root / name).mkdir()
        shutil.copy(HERE / f"{name}_config.json", root / name / "config.json")
        models.append(str(root / name))
    result = root / "result.json"
    pythonpath = f"{plugin_pythonpath(root / 'site')}{os.pathsep}{HERE}"
    env = {**os.environ, "PYTHONPATH": pythonpath, "VLLM_CACHE_ROOT": str(root / "cache"),
           "VLLM_LOGGING_LEVEL": "WARNING", **env_extra}  # fmt: skip
    env.pop("VLLM_PLUGINS", None)
    ran = _run([str(python), str(HERE / script), *models, str(result)], 600, env)
    assert ran.returncode == 0 and result.exists(), f"{script} failed:\n{ran.stdout[-3000:]}{ran.stderr[-3000:]}"
    return json.loads(result.read_text())


@pytest.fixture(scope="module")
def checks(vllm_python, tmp_path_factory) -> dict:
    return _run_check(
        vllm_python, tmp_path_factory.mktemp("vllm"), "vllm_checks.py", ["nemotron_h_8b", "nemotron_h_tiny"]
    )


@pytest.fixture(scope="module")
def layer_check(vllm_python, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("vllm_layer")
    return _run_check(
        vllm_python,
        root,
        "vllm_layer_check.py",
        ["nemotron_h_tiny_fp32"],
        TRITON_INTERPRET="1",
        CUDA_VISIBLE_DEVICES="",
    )


@pytest.fixture(scope="module")
def llm_args(vllm_python, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("vllm_llm")
    return _run_check(vllm_python, root, "vllm_llm_args_check.py", ["nemotron_h_8b", "nemotron_h_8b_mtp", "qwen3_5_4b"])


@pytest.mark.parametrize("variant", ["baseline", "replayssm_fp32", "replayssm_split"])
def test_engine_step_llm_arguments_build_vllm_024_configs(llm_args, variant):
    """engine_step's LLM(...) keywords, through vLLM's own constructor: O0 is -O0 with full decode graphs, default
    is vLLM's level 2; both with the fixed engine settings and the variant's knob as the plugin reads it."""
    o0, default = llm_args["cases"][f"{variant}/O0"], llm_args["cases"][f"{variant}/default"]
    assert (o0["optimization_level"], o0["cudagraph_mode"]) == (0, "FULL_DECODE_ONLY")
    assert (default["optimization_level"], default["cudagraph_mode"]) == (2, "None")  # None: vLLM picks per level
    for case in (o0, default):
        assert (case["load_format"], case["mamba_ssm_cache_dtype"], case["gpu_memory_utilization"]) == (
            "dummy", "float32", 0.45)  # fmt: skip
        assert (case["max_num_seqs"], case["max_model_len"]) == (256, 4096)
        assert case["config_prefix_caching"] is False and case["disable_log_stats"] is False
        assert case["replayssm"]["enable"] == (variant != "baseline")
        assert case["replayssm"]["split_precision"] == (variant == "replayssm_split")
        assert case["capture_sizes"] == [64, 256], "graphs are captured at the measured batches only"


def test_host_floor_config_is_a_model_vllm_024_builds_with_every_layer(llm_args):
    """The floor model (host_floor.py) keeps the 8B's 52 layers at hidden 256, and the plugin's knob reaches it."""
    real, floor = llm_args["cases"]["replayssm_fp32/default"], llm_args["floor"]
    assert (real["hidden_size"], real["layers"]) == (4096, 52)
    assert (floor["hidden_size"], floor["layers"]) == (256, 52)
    assert floor["replayssm"]["enable"] is True and floor["mamba_ssm_cache_dtype"] == "float32"


def test_qwen35_host_floor_config_is_a_model_vllm_024_builds_with_every_layer(llm_args):
    """Qwen3.5-4B's floor keeps its 32 layers (24 GDN, 8 attention) at hidden 256, text only as the gdn:V engine."""
    real, floor = llm_args["qwen/replayssm_fp32"], llm_args["qwen_floor"]
    assert (real["hidden_size"], real["layers"]) == (2560, 32)
    assert (floor["hidden_size"], floor["layers"]) == (256, 32)
    assert floor["replayssm"]["enable"] is True and floor["language_model_only"] == real["language_model_only"]
    assert floor["gdn_prefill_backend"] == real["gdn_prefill_backend"]


SPEC_ARM_RATES = [("native_standard", None), ("native_spec", [1.0, 1.0, 0.0]), ("replayssm_standard", None),
                  ("replayssm_spec", [1.0, 0.8, 0.0])]  # fmt: skip


@pytest.mark.parametrize(("arm", "rates"), SPEC_ARM_RATES)
def test_spec_step_arms_build_vllm_024_configs_with_mtp_and_synthetic_acceptance(llm_args, arm, rates):
    """spec_step's keywords on the MTP model dir: the spec arms resolve to vLLM's MTP drafter (NemotronHMTPModel)
    with synthetic rejection sampling (AL 3.0 -> rates 1, 1, 0; 2.8 -> 1, 0.8, 0), the standard arms to no
    speculation; the ReplaySSM arms carry the fp32 knobs, and the plugin refuses none of the four."""
    length = 3.0 if arm.startswith("native") else 2.8
    case = llm_args["cases"][f"{arm}/{length:g}"]
    assert case["replayssm"]["enable"] == arm.startswith("replayssm") and not case["replayssm"]["split_precision"]
    assert (case["optimization_level"], case["mamba_ssm_cache_dtype"], case["config_prefix_caching"]) == (
        2, "float32", False)  # fmt: skip
    assert case["refused"] == []
    # graphs at batches 64 and 256 and, speculating, at their verify steps of 4 tokens a row (vLLM's list stops at 512)
    assert case["capture_sizes"] == ([64, 256] if rates is None else [64, 256, 1024])
    if rates is None:
        assert case["speculative"] is None and case["verify_len"] == 0
        return
    spec = case["speculative"]
    assert (spec["method"], spec["num_speculative_tokens"], spec["rejection_sample_method"]) == ("mtp", 3, "synthetic")
    assert spec["synthetic_acceptance_rates"] == pytest.approx(rates)
    assert spec["draft_architectures"] == ["NemotronHMTPModel"] and case["verify_len"] == 4


@pytest.mark.parametrize("variant", ["baseline", "replayssm_fp32"])
def test_engine_step_builds_a_qwen3_5_engine_config_text_only_with_triton_gdn_prefill(llm_args, variant):
    """The gdn:V jobs' LLM(...) keywords for qwen3.5-4b through vLLM 0.24's constructor and engine config."""
    got = llm_args[f"qwen/{variant}"]
    assert (got["language_model_only"], got["gdn_prefill_backend"]) == (True, "triton")
    assert got["layers"] == 32 and got["mamba_ssm_cache_dtype"] == "float32"
    assert got["replayssm"]["enable"] == (variant != "baseline")


def test_step_profile_arguments_and_generate_api_exist_in_vllm_024(llm_args):
    assert llm_args["profiled"]["profiler"] == "torch" and llm_args["profiled"]["profiler_with_stack"] is False
    assert llm_args["sampling"] == {"max_tokens": 272, "min_tokens": 272, "ignore_eos": True, "temperature": 0.0,
                                    "detokenize": False}  # fmt: skip
    assert llm_args["prompt"] == [11, 12]
    assert llm_args["llm_methods"] == ["apply_model", "generate", "get_metrics", "start_profile", "stop_profile"]


@pytest.fixture(scope="module")
def server_args(vllm_python, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("vllm_server")
    return _run_check(vllm_python, root, "vllm_server_args_check.py", ["nemotron_h_8b", "qwen3_5_4b"])


@pytest.mark.parametrize("mode", ["O0", "default"])
def test_gpu_stage_server_flags_parse_in_vllm_024(server_args, mode):
    """tools/gpu/session.sh serves Qwen3.5 text only with Triton GDN prefill, Nemotron-H with no extra flag."""
    qwen, nemotron = server_args[f"qwen/{mode}"], server_args[f"nemotron/{mode}"]
    assert (qwen["language_model_only"], qwen["gdn_prefill_backend"]) == (True, "triton")
    assert (nemotron["flags"], nemotron["language_model_only"], nemotron["gdn_prefill_backend"]) == ([], False, None)


def test_agreement_request_asks_vllm_024_for_exact_greedy_token_ids(server_args):
    assert server_args["agreement_request"] == {
        "prompt": [11, 12, 13], "return_token_ids": True, "stream": False, "max_tokens": 512, "min_tokens": 512,
        "ignore_eos": True, "temperature": 0.0, "choice_has_token_ids": True,
    }  # fmt: skip


@pytest.fixture(scope="module")
def spec_flow(vllm_python, tmp_path_factory) -> dict:
    return _run_check(vllm_python, tmp_path_factory.mktemp("vllm_spec"), "vllm_spec_step_flow_check.py",
                      ["nemotron_h_8b_mtp"])  # fmt: skip


def test_spec_step_reads_vllms_own_counters_into_rows_per_arm(spec_flow):
    """spec_step.main against a stand-in engine counting through vLLM 0.24's PrometheusStatLogger: drafts, accepted
    tokens and engine steps come out exactly as emulated (AL 3: 6 and 92 steps for 16 and 272 tokens; standard:
    16 and 272), the capacity as vLLM's front end holds it, and the arm's keywords reach vllm.LLM."""
    assert spec_flow["exits"] == {"replayssm_spec": 0, "native_spec": 0, "native_standard": 0,
                                  "replayssm_spec_2.5": 1}  # fmt: skip
    kwargs = spec_flow["kwargs"]
    assert "'synthetic_acceptance_length': 3.0" in kwargs["replayssm_spec"]["speculative_config"]
    assert "'enable': True" in kwargs["replayssm_spec"]["additional_config"]
    assert "speculative_config" not in kwargs["native_standard"] and "additional_config" not in kwargs["native_spec"]
    rows = {(r["arm"], r["acceptance_length_configured"], r["batch"]): r for r in spec_flow["file"]["rows"]}
    assert list(rows) == [("native_standard", None, 4), ("native_spec", 3.0, 4), ("replayssm_spec", 2.5, 4),
                          ("replayssm_spec", 3.0, 4), ("replayssm_spec", 3.0, 8)]  # fmt: skip
    for (arm, length, batch), row in rows.items():
        steps = (16, 272) if length is None else (1 + -(-15 // int(length)), 1 + -(-271 // int(length)))
        assert [(r["steps_short"], r["steps_long"]) for r in row["repeats"]] == [steps] * 3
        assert row["drafts"] == (0 if length is None else 3 * batch * (steps[0] + steps[1] - 2))
        assert row["preemptions"] == 0 and row["exact"] and row["tokens_per_s"] > 0 and row["step_ms"] > 0
        assert row["max_concurrency"] == (24.0 if arm == "native_spec" else 96.0) and row["max_model_len"] == 2048
    assert rows[("replayssm_spec", 3.0, 8)]["acceptance_length_measured"] == 3.0
    # the decode window on the stand-in engine's clock (5 ms a step): AL 3 gives 3 tokens per request per step
    assert {row["window_step_ms"] for row in rows.values()} == {5.0}
    assert rows[("native_standard", None, 4)]["window_tokens_per_s"] == 800.0
    assert rows[("replayssm_spec", 3.0, 4)]["window_tokens_per_s"] == round(4 * 271 / (91 * 0.005), 1)
    assert rows[("native_standard", None, 4)]["acceptance_length_measured"] is None
    assert all(rows[key]["valid"] for key in rows if key[1] != 2.5)


def test_spec_step_invalidates_an_acceptance_off_its_configuration_and_summarises(spec_flow):
    bad = spec_flow["file"]["rows"][2]
    assert (bad["acceptance_length_configured"], bad["acceptance_length_measured"], bad["valid"]) == (2.5, 2.0, False)
    assert bad["problems"] == ["measured acceptance length 2.000 is 20.0% off the configured 2.5 (tolerance 5%): "
                               "its speed is not comparable"]  # fmt: skip
    summary = spec_flow["summary"]
    assert spec_flow["summarise_exit"] == 0 and "## default mode, k = 3, AL 3 configured" in summary
    batch4 = next(line for line in summary.split("AL 3 configured")[1].splitlines() if line.startswith("| 4 |"))
    assert batch4.endswith("| 24.0 → 96.0 (4.00×) |") and "AL 3.00" in batch4 and batch4.count("×") == 3
    assert "- replayssm_spec default, k 3, AL 2.5, batch 4: measured acceptance length 2.000" in summary


@pytest.fixture(scope="module")
def engine_flow(vllm_python, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("vllm_flow")
    return _run_check(vllm_python, root, "vllm_engine_flow_check.py", ["nemotron_h_8b"])


def test_engine_step_runs_warm_up_then_alternating_exact_greedy_generates(engine_flow):
    """engine_step.main end to end against a stand-in for vllm.LLM (real SamplingParams / TokensPrompt in, real
    engine stats out): per batch one warm-up of 16 tokens, then 16/272, 272/16, 16/272 of fresh 1024-id prompts."""
    split = engine_flow["split"]
    assert split["exit"] == 0
    assert "'enable': True" in split["kwargs"]["additional_config"]
    assert split["kwargs"]["compilation_config"] == "{'cudagraph_capture_sizes': [4, 8]}"  # the batches measured
    order = [(c["batch"], c["max_tokens"]) for c in split["calls"]]
    per_batch = [16, 16, 272, 272, 16, 16, 272]
    assert order == [(4, t) for t in per_batch] + [(8, t) for t in per_batch]
    for call in split["calls"]:
        assert call["min_tokens"] == call["max_tokens"] and call["ignore_eos"] and call["temperature"] == 0.0
        assert (call["prompt_len"], call["ids_in_range"]) == (1024, True)
        assert not call["detokenize"] and not call["use_tqdm"]
    # the warm-up is LLM.generate; the timed generates step the engine themselves, to see each step's timestamp
    assert [c["stepped"] for c in split["calls"][:7]] == [False] + [True] * 6
    assert engine_flow["baseline"]["kwargs"]["optimization_level"] == "0"


def test_engine_step_rows_read_the_decode_window_off_the_engine_clock(engine_flow):
    """The stand-in engine's decode steps take 5 ms on its own clock and its prefill steps 40 ms (2 requests
    each): the window holds the decode steps from the last first token to the first last token, and nothing of
    the prefill, whatever the wall clock of the generates says."""
    rows = engine_flow["steps_file"]["rows"]
    assert [(r["batch"], r["window_step_ms"], r["window_spread_ms"], r["window_p90_ms"]) for r in rows] == [
        (4, 5.0, 0.0, 5.0), (4, 5.0, 0.0, 5.0), (8, 5.0, 0.0, 5.0),
    ]  # fmt: skip
    # B=4: prefill in steps 1-2, the first request's 272nd token in step 272; B=8: prefill in steps 1-4
    assert [r["window_steps"] for r in rows] == [270, 270, 268]
    windows = [repeat["window"] for repeat in rows[1]["repeats"]]
    assert (
        windows
        == [{"steps": 270, "mean_ms": 5.0, "p50_ms": 5.0, "p90_ms": 5.0, "max_ms": 5.0, "tokens_per_s": 800.0}] * 3
    )
    assert rows[2]["window_tokens_per_s"] == 1600.0  # 8 requests a token every 5 ms


def test_engine_step_rows_merge_from_two_runs_into_one_valid_file(engine_flow):
    saved = engine_flow["steps_file"]
    rows = saved["rows"]
    assert [(r["variant"], r["mode"], r["batch"]) for r in rows] == [
        ("baseline", "O0", 4), ("replayssm_split", "default", 4), ("replayssm_split", "default", 8),
    ]  # fmt: skip
    assert [len(r["repeats"]) for r in rows] == [1, 3, 3]
    assert [r["replayssm_layers"] for r in rows] == [0, 24, 24]
    from replayssm_patch.kernels.launch_config import GDN_DEFAULT

    # no GPU here: no tuned file
    defaults = {"source": "defaults", "fp32": "16x64x1w", "split": "16x64x1w", "gdn": GDN_DEFAULT.as_key(),
                "native_batches": "fp32 <= 0, gdn <= 0"}  # fmt: skip
    assert [r["launch_shapes"] for r in rows] == [None, defaults, defaults]
    assert all(r["valid"] and r["problems"] == [] and r["exact"] and r["preemptions"] == 0 for r in rows)
    assert all(r["engine_tpot_ms"] > 0 and r["engine_tpot_tokens"] == 272 for r in rows)
    assert len(saved["commands"]) == 2 and saved["machine"]["vllm"] == "0.24.0"


def test_step_profile_profiles_one_generate_per_batch_and_keeps_only_the_summary(engine_flow):
    profile = engine_flow["profile"]
    assert profile["exit"] == 0 and "'profiler': 'torch'" in profile["kwargs"]["profiler_config"]
    assert [(c["max_tokens"], c["profiling"]) for c in profile["calls"]] == [(16, False), (2 + 16 + 8, True)]
    (row,) = engine_flow["profile_file"]["rows"]
    assert (row["variant"], row["batch"], row["steps"], row["span_us"]) == ("replayssm_fp32", 4, 16, 1000.0)
    assert row["kinds"]["gemm"]["us"] == 100.0 and row["ran_together"] is True
    assert "| replayssm_fp32 | O0 | 4 | 16 |" in engine_flow["profile_md"]
    assert engine_flow["traces_left"] == []  # the raw trace is deleted once summarised


def test_step_profile_measures_engine_step_rows_first_in_the_same_engine(engine_flow):
    """--step-batches: one engine start-up serves engine_step's rows and then the profile, CUDA graphs captured at
    both lists' batches; the rows say the profiler was configured (idle while they were measured)."""
    both = engine_flow["both"]
    assert both["exit"] == 0 and "'profiler': 'torch'" in both["kwargs"]["profiler_config"]
    assert both["kwargs"]["compilation_config"].endswith(
        "'cudagraph_capture_sizes': [4, 8]}"
    )  # O0: FULL_DECODE_ONLY too
    steps = [(c["batch"], c["max_tokens"], c["profiling"]) for c in both["calls"]]
    rows_then_profile = [(4, 16, False), (4, 16, False), (4, 272, False), (8, 16, False), (8, 16, False),
                         (8, 272, False), (4, 16, False), (4, 2 + 16 + 8, True)]  # fmt: skip
    assert steps == rows_then_profile
    rows = engine_flow["both_steps_file"]["rows"]
    assert [(r["batch"], r["window_step_ms"], r["profiler_configured"], r["valid"]) for r in rows] == [
        (4, 5.0, True, True), (8, 5.0, True, True),
    ]  # fmt: skip
    assert engine_flow["steps_file"]["rows"][0]["profiler_configured"] is False
    (profiled,) = engine_flow["both_profile_file"]["rows"]
    assert (profiled["batch"], profiled["steps"]) == (4, 16)


def test_engine_step_fit_runs_the_largest_batch_the_engine_holds(engine_flow):
    """`--batches fit`: graphs up to --max-num-seqs, then the batch of vLLM's maximum concurrency (6.5 -> 6)."""
    fit = engine_flow["fit"]
    assert fit["exit"] == 0 and fit["kwargs"]["compilation_config"].endswith("'cudagraph_capture_sizes': [256]}")
    assert {c["batch"] for c in fit["calls"]} == {6}
    (row,) = engine_flow["fit_steps_file"]["rows"]
    assert (row["batch"], row["max_concurrency"], row["valid"], row["window_steps"]) == (6, 6.5, True, 269)


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
    assert got["shapes"][2:] == [[128, 16], [128, 16, 64], [8, 16, 128], [128, 64, 128]]
    assert got["dtypes"][2:] == ["torch.float32", "torch.bfloat16", "torch.bfloat16", "torch.bfloat16"]
    extra = 16 * 128 * 4 + 16 * 128 * 64 * 2 + 16 * 8 * 128 * 2 + 128 * 64 * 128 * 2
    assert got["page_size_bytes"] == stock["page_size_bytes"] + extra


def test_enabled_model_builds_replay_layers_everywhere(checks):
    tiny = checks["tiny_model"]
    assert tiny["mixer_classes"] == ["ReplayMambaMixer2"] and tiny["mixers"] == 2  # pattern "M*M"


def test_real_builder_plans_capture_decode_and_prefill(checks):
    steps = checks["tiny_model"]["steps"]
    # capture touched no cursor and lists no row to fold
    assert steps[0] == {"capture_write_pos": [0, 0], "table_allocated": False, "capture_flush_list": []}
    assert [s["write_pos"] for s in steps[1:6]] == [[0, 0], [1, 1], [2, 2], [3, 3], [0, 0]]  # L=4
    assert [s["flush_len"] for s in steps[1:6]] == [[0, 0], [0, 0], [0, 0], [4, 4], [0, 0]]
    assert [s["flush_list"] for s in steps[1:6]] == [[], [], [], [0, 1], []]  # the fold's work list
    # beside a prefill the decode row (block 3, cursor 1) still appends (a fold each mixed step would cost more
    # than vLLM's decode); the fresh prompt in reused block 6 reads none of its 2 stale entries and restarts, and
    # the CPU knows it is fresh (seq len = query len), so no layer launches a fold for that step
    assert steps[6] == {"decodes": 1, "prefills": 1, "write_pos": [1], "flush_len": [0], "pending": [0],
                        "fold_pending": False,
                        "after": [0, 0, 0, 2, 0, 1, 0, 0]}  # fmt: skip


def test_other_kv_cache_groups_read_the_one_shared_plan(checks):
    """vLLM builds one Mamba group per step and updates the rest (update_block_table): a request's cursor is the
    same in every group, so they take the first group's plan (flush step: [3, 3] / [4, 4]) for their own blocks,
    from the same persistent buffers (what every group's captured graphs read: nothing is copied per group),
    and keep no cursor table."""
    assert checks["tiny_model"]["other_group"] == {
        "slots": [2, 4], "write_pos": [3, 3], "flush_len": [4, 4], "shared_buffers": True, "cursor_table": False,
    }  # fmt: skip


def test_prefix_caching_is_refused_from_a_real_config(checks):
    refused = checks["tiny_model"]["refused_prefix_caching"]
    assert refused.startswith("ReplaySSMRefused: ReplaySSM refused: mamba prefix caching mode 'all'")


@pytest.mark.parametrize(("mode", "tolerance"), [("fp32", 1e-5), ("split", 1e-2)])
def test_replay_layer_matches_vllm_layer_step_by_step(layer_check, mode, tolerance):
    """fp32: same math in another order (observed ~4e-7). split: the non-flush steps read a bf16 copy of the
    checkpoint (8-bit mantissa, ~4e-3 per element, averaged over d_state; observed <= 3e-3)."""
    got = layer_check[mode]
    assert len(got["output_rel_err"]) == 9
    assert max(got["output_rel_err"]) <= tolerance
    assert got["cursors"] == [[(s + 1) % 4] * 3 for s in range(9)]  # L=4: flushes on steps 3 and 7


def test_installing_the_layer_logs_that_replayssm_is_active(layer_check):
    """The server log must prove the plugin ran: the harness's plugin check reads it."""
    assert layer_check["install_log"] == [
        "ReplaySSM active: MambaMixer2 layers replaced (buffer_len=4, split_precision=False)"
    ]


# vllm_checks.NATIVE_SCHEDULE with L = 4 and windows aligned to the prefill (a row folds when its ring fills)
NATIVE_REGIME = [False] * 3 + [True] * 3 + [False] * 3 + [True] * 2 + [False]
NATIVE_TRANSITIONS = [None] * 3 + [[3, 3], None, None] + [None] * 3 + [[2], None, None]
NATIVE_CURSORS = [[1, 1, 1], [2, 2, 2], [3, 3, 3], [0, 0, 3], [0, 0, 3], [0, 0, 3],
                  [1, 1, 0], [2, 2, 1], [3, 3, 2], [3, 3, 0], [3, 3, 0], [0, 0, 1]]  # fmt: skip


def assert_native_regime(got: dict, output_tolerance: float, state_tolerance: float) -> None:
    """Decode steps through the real builders under a launch table whose native limit is 2 rows, the batch crossing
    it both ways (3 rows, 2, 3, 1, 3): graphs of 2 rows are captured native, of 3 the ring's. The first native step
    folds its rows' rings (3 entries each) and restarts them; slot 3, left out of that step, keeps its 3 entries and
    folds them on its next replay step (its ring full), and slots 1 and 2 do the same around the second transition.
    A native step plans nothing (cursors and rings untouched) and is vLLM's own layer, bit for bit, from the
    ReplaySSM checkpoint; every step agrees with vLLM's layer from the start, and so does the final state."""
    assert got["captured_native"] == {"2": True, "3": False} and got["table_allocated_by_captures"] is False
    steps = got["steps"]
    assert [step["native"] for step in steps] == NATIVE_REGIME
    assert [step["transition"] for step in steps] == NATIVE_TRANSITIONS
    assert [step["cursors"] for step in steps] == NATIVE_CURSORS
    assert [step["rings_untouched"] for step in steps] == NATIVE_REGIME, "only replay steps append to a ring"
    assert all(step["equals_vllm_bit_for_bit"] for step in steps if step["native"])
    assert all(step["twin_equal"] for step in steps), "the other layer folded at every transition too"
    assert max(step["rel_err"] for step in steps) <= output_tolerance
    assert got["pending_at_end"] == [0, 0, 1]
    assert got["state_rel_err"] <= state_tolerance and got["twin_state_equal"] and got["conv_state_equal"]


def test_a_native_step_beside_a_prefill_keeps_folding_until_a_decode_only_step(layer_check):
    """A prefill chunk can spend the token budget before a running request's turn, so after a transition with
    prefill rows the next native step folds its rows again (block 2's one entry); a decode-only step schedules
    every running request, so after it no ring holds entries and native steps fold nothing."""
    assert layer_check["native_flags"] == [
        {"native": False, "transition": None, "ring_may_hold": True},
        {"native": True, "transition": [1], "ring_may_hold": True},
        {"native": True, "transition": [0, 1], "ring_may_hold": False},
        {"native": True, "transition": None, "ring_may_hold": False},
    ]


def test_native_regime_runs_vllms_own_decode_between_replay_steps(layer_check):
    """native_max_batch 2 (fp32), the Mamba-2 layer against vLLM's with the fp64 SSU; the second KV-cache group
    (vLLM's update_block_table) folds the same rows at its own blocks at each transition, so it answers exactly as
    the first. Split precision never runs vLLM's path (it would leave the bf16 copy stale): its limit is 0."""
    assert_native_regime(layer_check["native"], output_tolerance=1e-5, state_tolerance=1e-5)
    assert layer_check["native"]["split_precision_limit"] == 0


@pytest.mark.parametrize("mode", ["fp32", "split"])
def test_profile_run_passes_through_vllms_warm_up(layer_check, mode):
    """vLLM's profile run (no metadata) unpacks get_state_dtype() as (conv, ssm): those stay stock."""
    got = layer_check[mode]
    assert got["profile_run"] == "ok"
    assert len(got["state_dtypes"]) == 2 and got["state_dtypes"][1] == "torch.float32"  # (conv, fp32 ssm)


@pytest.mark.parametrize("mode", ["fp32", "split"])
def test_startup_capture_build_compiles_the_prefill_fold_without_touching_state(layer_check, mode):
    """The materialise fold is launched once at start-up (a capture build), on the null block: no cursor table,
    no cache byte changed; serving then never compiles it mid-run."""
    assert layer_check[mode]["startup_warm"] == {"warmed": True, "cache_unchanged": True, "table_allocated": False}


@pytest.mark.parametrize("mode", ["fp32", "split"])
def test_fold_before_prefill_leaves_the_exact_state(layer_check, mode):
    got = layer_check[mode]
    assert got["pending"] == [1, 1, 1, 0]  # continuing rows: one entry since the last flush; a fresh prompt: none
    assert got["state_rel_err_after_fold"] <= 1e-5  # fp32 master in both modes
    assert got["conv_state_equal"]


@pytest.fixture(scope="module")
def spec_layer(vllm_python, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("vllm_spec_layer")
    return _run_check(vllm_python, root, "vllm_spec_layer_check.py", ["nemotron_h_tiny_fp32"], TRITON_INTERPRET="1",
                      CUDA_VISIBLE_DEVICES="")  # fmt: skip


def test_spec_layer_spec_keeps_one_block_the_widened_conv_and_a_ring_of_l_plus_t(spec_layer):
    """k = 3: vLLM's spec has 3 speculative blocks and a conv window of K-1+k = 6; ReplaySSM's has none, the same
    conv and (ssm) shapes, rings of L + 1 + k = 8 entries, and equals what the model classmethods size."""
    base, rep = spec_layer["specs"]["base"], spec_layer["specs"]["rep"]
    assert (base["blocks"], rep["blocks"]) == (3, 0)
    assert rep["shapes"][:2] == base["shapes"] == [[6, 128], [8, 8, 16]]
    assert rep["shapes"][2:] == [[8, 8], [8, 8, 8], [2, 8, 16]]  # dt [H, L+T], x [H, L+T, P], B [G, L+T, N]
    assert spec_layer["model_shapes"] == rep["shapes"]


def test_spec_verify_matches_vllms_speculative_layer_across_commits_rollbacks_and_folds(spec_layer):
    """10 verify steps of 4 tokens (3 rows): all accepted, all rejected, then mixed acceptance; every token's output
    agrees with vLLM's 1+k-state layer (same math in another order, observed <= 5e-7), and the checkpoint after
    folding the rings (accepted prefix included) equals vLLM's state after the accepted tokens."""
    assert len(spec_layer["output_rel_err"]) == 10 and max(spec_layer["output_rel_err"]) <= 1e-5
    plans = spec_layer["plans"]
    assert plans[0] == {"accepted": [1, 1, 1], "write_pos": [0, 0, 0], "fold_len": [0, 0, 0]}  # after the prefill
    assert sum(f > 0 for p in plans for f in p["fold_len"]) >= 6  # folds under every pattern
    assert plans[4]["write_pos"] == [1, 1, 1] and plans[5]["write_pos"] == [2, 2, 2]  # all rejected: +1 per step
    assert all(w + 4 <= 8 for p in plans for w in p["write_pos"])
    assert spec_layer["state_rel_err_after_fold"] <= 1e-5


def test_spec_capture_builds_are_dry_runs(spec_layer):
    assert spec_layer["capture"] == {"write_pos": [0, 0, 0], "fold_len": [0, 0, 0], "table_allocated": False}
    assert spec_layer["recapture_moved_cursors"] is False


def test_spec_verify_never_takes_the_native_regime(spec_layer):
    """The check runs under a launch table whose native limit (8) covers its 3 rows: under speculation the limit is
    0 (a verify row is not vLLM's one-token decode), and the verify steps above are ReplaySSM's."""
    assert spec_layer["native_limit"] == 0


@pytest.fixture(scope="module")
def gdn_kernels(vllm_python, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("vllm_gdn_kernels")
    return _run_check(vllm_python, root, "vllm_gdn_kernel_check.py", [], TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gdn_ring_of_one_is_vllms_packed_decode_bit_for_bit(gdn_kernels, dtype):
    """L = 1 (every step a fold of an empty ring) computes vLLM's own GDN decode step, in the same order: equal
    outputs and states over 6 steps, with bf16 or fp32 activations (vLLM's packed kernel, interpreted)."""
    got = gdn_kernels[f"L1/{dtype}"]
    assert got["output_equal"] == [True] * 6 and got["state_equal_after_fold"] == [True] * 6


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gdn_replay_tracks_vllms_packed_decode_across_flushes(gdn_kernels, dtype):
    """L = 4 over 18 steps (4 folds): same math in another order (observed <= 6e-7)."""
    got = gdn_kernels[f"L4/{dtype}"]
    assert len(got["output_rel_err"]) == 18 and max(got["output_rel_err"]) <= 1e-5
    assert len(got["state_rel_err_after_fold"]) == 4 and max(got["state_rel_err_after_fold"]) <= 1e-6
    # vLLM zeroes a null-block row's output; the replay step leaves it as it was (vLLM's buffer starts zeroed)
    assert got["null_row"] == {"ours_left_alone": True, "vllm": 0.0}


def test_main_venv_stays_free_of_vllm():
    """The plugin's vLLM-free parts import without vLLM (register() is only called by vLLM)."""
    code = "import replayssm_patch, replayssm_patch.config, replayssm_patch.cursors, replayssm_patch.refusals"
    code += ", replayssm_patch.state_layout"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.fixture(scope="module")
def gdn_checks(vllm_python, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("vllm_gdn")
    return _run_check(vllm_python, root, "vllm_gdn_checks.py", ["qwen3_5_4b", "qwen3_5_tiny"],
                      TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")  # fmt: skip


@pytest.mark.parametrize("case", ["disabled", "disabled_after_enabled"])
def test_gdn_disabled_is_vllm_exactly(gdn_checks, case):
    got = gdn_checks[case]
    assert got["model_class"] == "ReplayQwen3_5ForConditionalGeneration"  # registered by load_general_plugins
    # vLLM's initialize_model passes vllm_config and prefix only to an __init__ naming both
    assert {"vllm_config", "prefix"} <= set(got["init_parameters"])
    assert got["model_spec"] == got["stock_spec"] == got["layer_spec"]
    assert got["layer_class"] == "QwenGatedDeltaNetAttention" and got["layer_is_stock_class"]
    assert got["backend_is_stock"] and got["builder"] == "GDNAttentionMetadataBuilder"


def test_gdn_enabled_spec_appends_the_fp32_ring_and_equals_the_model_classmethods(gdn_checks):
    """Qwen3.5-4B shape, L=16: k̂ [16, 16 key heads, 128], u [16, 32 value heads, 128], g [16, 32], all fp32."""
    got = gdn_checks["enabled"]
    assert got["layer_spec"] == got["model_spec"]
    assert got["model_spec"]["shapes"][:2] == got["stock_spec"]["shapes"] == [[3, 8192], [32, 128, 128]]
    assert got["model_spec"]["shapes"][2:] == [[16, 16, 128], [16, 32, 128], [16, 32]]
    assert got["model_spec"]["dtypes"][2:] == ["torch.float32"] * 3
    assert got["stock_spec"]["page_size_bytes"] == 2146304
    assert got["model_spec"]["page_size_bytes"] == 2146304 + 4 * 16 * (16 * 128 + 32 * 128 + 32)
    assert (got["layer_class"], got["backend"], got["builder"]) == (
        "ReplayGatedDeltaNet", "ReplayGDNAttentionBackend", "ReplayGDNAttentionMetadataBuilder")  # fmt: skip


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("cpu_platform", "only vLLM's CUDA forward of the Gated DeltaNet layer is wrapped"),
        ("bf16_state", "checkpoint must be fp32 (vLLM resolved bfloat16); start with --mamba-ssm-cache-dtype float32"),
        ("split_precision", "set split_precision to false"),
        ("prefix_caching", "mamba prefix caching mode 'align'"),
    ],
)
def test_gdn_unsupported_settings_are_refused_from_real_configs(gdn_checks, case, needle):
    refused = gdn_checks["refused"][case]
    assert refused.startswith("ReplaySSMRefused: ReplaySSM refused: ") and needle in refused


def test_gdn_fp32_state_on_cuda_is_accepted(gdn_checks):
    assert gdn_checks["refused"]["fp32_supported"] is None


def test_gdn_native_regime_runs_vllms_own_decode_between_replay_steps(gdn_checks):
    """gdn_native_max_batch 2, the GDN layer against vLLM's packed decode (interpreted); the second layer of the
    group is folded by the same builder at each transition, so it answers exactly as the first."""
    assert_native_regime(gdn_checks["native"], output_tolerance=1e-5, state_tolerance=1e-6)


def test_gdn_builder_plans_capture_and_decode_with_its_own_cursor_table(gdn_checks):
    steps = gdn_checks["builder"]["steps"]
    # capture touched no cursor and lists no row to fold
    assert steps[0] == {"capture_write_pos": [0, 0], "table_allocated": False, "capture_flush_list": []}
    assert [s["write_pos"] for s in steps[1:6]] == [[0, 0], [1, 1], [2, 2], [3, 3], [0, 0]]  # L=4
    assert [s["flush_len"] for s in steps[1:6]] == [[0, 0], [0, 0], [0, 0], [4, 4], [0, 0]]
    assert [s["flush_list"] for s in steps[1:6]] == [[], [], [], [0, 1], []]  # the fold's work list


def test_gdn_mixed_step_replays_decode_rows_and_hands_vllm_a_prefill_only_view(gdn_checks):
    """Block 3 decodes (cursor 1) beside a continuing 5-token chunk (block 5, one pending entry to fold) and a fresh
    7-token prompt in reused block 6 (stale cursor 2: folds nothing). vLLM's own path gets the prefill rows alone."""
    mixed = gdn_checks["builder"]["steps"][6]
    assert (mixed["decodes"], mixed["prefills"], mixed["write_pos"], mixed["pending"]) == (1, 2, [1], [1, 0])
    assert mixed["after"] == [0, 0, 0, 2, 0, 0, 0, 0]
    assert mixed["fold_pending"] is True  # the continuing chunk may hold entries: the layers fold
    assert gdn_checks["builder"]["fresh_prompt_fold_pending"] is False  # fresh prompts only: no fold launch
    assert mixed["view"] == {"decodes": 0, "actual_tokens": 12, "query_start_loc": [0, 5, 12], "state_indices": [5, 6],
                             "has_initial_state": [True, False], "conv_programs": 2}  # fmt: skip


def test_gdn_new_one_token_prompt_decodes_from_a_zero_state(gdn_checks):
    """vLLM counts a new 1-token prompt as a GDN decode row and its own layer reads the slot's previous owner's
    state; ReplaySSM restarts the cursor and zeroes checkpoint and conv state, as a prefill without state would."""
    fresh = gdn_checks["builder"]["steps"][7]
    assert (fresh["decodes"], fresh["write_pos"]) == (2, [2, 0])
    assert fresh["fresh_state_zero"] and fresh["other_state_kept"]


def test_gdn_whole_qwen3_5_model_builds_replay_layers_everywhere(gdn_checks):
    assert gdn_checks["whole_model"] == {"classes": ["ReplayGatedDeltaNet"], "layers": 3}  # 3 GDN + 1 attention


def test_gdn_model_class_builds_through_vllms_own_loader_when_disabled(gdn_checks):
    """vLLM's initialize_model (what failed on the H200 with a **kwargs __init__) builds the registered class."""
    assert gdn_checks["stock_path"] == {
        "model_class": "ReplayQwen3_5ForConditionalGeneration", "classes": ["QwenGatedDeltaNetAttention"],
    }  # fmt: skip


@pytest.fixture(scope="module")
def gdn_layer_smoke(vllm_python, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("vllm_gdn_layer")
    (root / "model").mkdir()
    shutil.copy(HERE / "qwen3_5_tiny_config.json", root / "model" / "config.json")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "",
           "VLLM_LOGGING_LEVEL": "WARNING", "VLLM_CACHE_ROOT": str(root / "cache")}  # fmt: skip
    cmd = [str(vllm_python), "-m", "replayssm_patch.gpu.gdn_layer_check", "--model", str(root / "model"),
           "--out", str(root / "out"), "--smoke"]  # fmt: skip
    ran = _run(cmd, 600, env)
    assert ran.returncode == 0, f"gdn_layer_check --smoke failed:\n{ran.stdout[-3000:]}{ran.stderr[-3000:]}"
    assert "| worst output rel. error |" in (root / "out" / "gdn_layer_check.md").read_text()
    return json.loads((root / "out" / "gdn_layer_check.json").read_text())


def test_gdn_layer_matches_vllms_own_decode_path_across_folds(gdn_layer_smoke):
    """ReplayGatedDeltaNet._forward_core vs vLLM's (causal-conv update + packed recurrent decode, interpreted),
    both through their real builders on a paged cache: 9 steps with L=4 (two folds), realistic gates
    (observed <= 2.3e-7); the checkpoint after folding what the rings hold equals vLLM's state."""
    got = gdn_layer_smoke
    assert (got["steps"], got["batch"], got["buffer_len"], got["dtype"]) == (9, 3, 4, "torch.float32")
    assert len(got["output_rel_err"]) == 9 and got["worst_output_rel_err"] <= 1e-5
    # staggered first windows: each ring holds 0..L-1 entries after 9 steps, folded into the checkpoint below
    assert len(got["pending_before_fold"]) == 3 and all(0 <= n < 4 for n in got["pending_before_fold"])
    assert got["final_state_rel_err"] <= 1e-6 and got["conv_state_equal"]


def test_gdn_layer_check_without_a_gpu_or_interpreter_says_what_to_do(vllm_python, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("TRITON_INTERPRET", None)
    cmd = [str(vllm_python), "-m", "replayssm_patch.gpu.gdn_layer_check", "--model", str(tmp_path), "--out",
           str(tmp_path / "out")]  # fmt: skip
    ran = _run(cmd, 300, env)
    assert ran.returncode == 2 and ran.stdout.strip().splitlines()[-1].startswith("error: no CUDA GPU")
