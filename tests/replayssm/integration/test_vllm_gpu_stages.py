"""The GPU stages' scripts against real vllm==0.24.0 (CPU venv from tools/vllm_venv.sh, built once and cached).

engine_step's, step_profile's, spec_step's and host_floor's `vllm.LLM(...)` keywords go through vLLM's own
constructor up to the engine config (vllm_llm_args_check.py); tools/gpu's server flags and `replaybench agree`'s
request body through vLLM's OpenAI server parsers (vllm_server_args_check.py); engine_step, step_profile,
churn_step, churn_host_profile and spec_step run end to end against a stand-in for `vllm.LLM` with vLLM's real
inputs, stats and Prometheus logger (vllm_engine_flow_check.py, vllm_spec_step_flow_check.py). Their CPU parts:
test_engine_step.py, test_spec_step.py.
"""

from __future__ import annotations

import pytest

from replayssm_patch.gpu.host_profile import arm_difference
from tests.replayssm.integration.check_runner import VLLM_VENV_MARKS, run_check

pytestmark = VLLM_VENV_MARKS


@pytest.fixture(scope="module")
def llm_args(vllm_python, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("vllm_llm")
    return run_check(vllm_python, root, "vllm_llm_args_check.py", ["nemotron_h_8b", "nemotron_h_8b_mtp", "qwen3_5_4b"])


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
                  ("replayssm_spec", [1.0, 0.8, 0.0]), ("replayssm_split_spec", [1.0, 0.8, 0.0]),
                  ("replayssm_spec_l28", [1.0, 0.8, 0.0])]  # fmt: skip


@pytest.mark.parametrize(("arm", "rates"), SPEC_ARM_RATES)
def test_spec_step_arms_build_vllm_024_configs_with_mtp_and_synthetic_acceptance(llm_args, arm, rates):
    """spec_step's keywords on the MTP model dir: the spec arms resolve to vLLM's MTP drafter (NemotronHMTPModel)
    with synthetic rejection sampling (AL 3.0 -> rates 1, 1, 0; 2.8 -> 1, 0.8, 0), the standard arms to no
    speculation; the ReplaySSM arms carry their variant's knobs (split precision in one), and the plugin refuses none
    of the six."""
    length = 3.0 if arm.startswith("native") else 2.8
    case = llm_args["cases"][f"{arm}/{length:g}"]
    assert case["replayssm"]["enable"] == arm.startswith("replayssm")
    assert case["replayssm"]["split_precision"] == ("split" in arm)
    assert case["replayssm"]["buffer_len"] == (28 if arm.endswith("_l28") else 16)
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
    return run_check(vllm_python, root, "vllm_server_args_check.py", ["nemotron_h_8b", "qwen3_5_4b"])


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
    return run_check(vllm_python, tmp_path_factory.mktemp("vllm_spec"), "vllm_spec_step_flow_check.py",
                      ["nemotron_h_8b_mtp"])  # fmt: skip


def test_spec_step_reads_vllms_own_counters_into_rows_per_arm(spec_flow):
    """spec_step.main against a stand-in engine counting through vLLM 0.24's PrometheusStatLogger: drafts, accepted
    tokens and engine steps come out exactly as emulated (AL 3: 6 and 92 steps for 16 and 272 tokens; standard:
    16 and 272), the capacity as vLLM's front end holds it, and the arm's keywords reach vllm.LLM."""
    assert spec_flow["exits"] == {"replayssm_spec": 0, "native_spec": 0, "native_standard": 0,
                                  "replayssm_spec_2.5": 1, "profiled": 0}  # fmt: skip
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
    for (arm, _, _), row in rows.items():  # what the machine did (no GPU here) and which launch table ran
        assert row["conditions"]["samples"] >= 1 and row["conditions"]["gpu_clock_share"] is None
        assert (row["launch_shapes"] is None) == (not arm.startswith("replayssm")) and row["cpu_model"]


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


def test_spec_step_profiles_the_arm_after_its_rows_in_the_same_engine(spec_flow):
    """--profile-batches: the torch profiler configured at start-up, the rows first, then one profiled generate
    sized for 16 + 8 verify steps of AL 3 tokens after the prefill, summarised into a row keyed as spec rows are."""
    assert "'profiler': 'torch'" in spec_flow["kwargs"]["profiled"]["profiler_config"]
    prefill_steps = -(-4 * 1024 // spec_flow["token_budget"])
    profiled = [(c["max_tokens"], c["profiling"]) for c in spec_flow["calls"]["profiled"] if c["profiling"]]
    assert profiled == [(prefill_steps + (16 + 8) * 3, True)]
    (row,) = spec_flow["profile_file"]["rows"]
    assert (row["arm"], row["variant"], row["acceptance_length_configured"], row["batch"], row["steps"]) == (
        "replayssm_spec", "replayssm_fp32", 3.0, 4, 16)  # fmt: skip
    assert "| replayssm_spec (AL 3) | default | 4 | 16 |" in spec_flow["profile_md"]


@pytest.fixture(scope="module")
def engine_flow(vllm_python, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("vllm_flow")
    return run_check(vllm_python, root, "vllm_engine_flow_check.py", ["nemotron_h_8b"])


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
    summary = {"steps": 270, "mean_ms": 5.0, "p50_ms": 5.0, "p90_ms": 5.0, "max_ms": 5.0, "tokens_per_s": 800.0}
    sequence = {"periods_ms": [5.0] * 270, "step_tokens": [4] * 270}  # each step in order: where slow ones fall
    assert windows == [summary | sequence] * 3
    assert rows[2]["window_tokens_per_s"] == 1600.0  # 8 requests a token every 5 ms
    # every batch keeps what the machine did meanwhile (no nvidia-smi here: the host alone, and why)
    wanted = {"baseline-O0-b4.json", "replayssm_split-default-b4.json", "replayssm_split-default-b8.json"}
    assert wanted <= set(engine_flow["engine_telemetry"])  # one file per variant, mode and batch
    for row in rows:
        assert row["conditions"]["samples"] >= 1 and row["conditions"]["cpu_busy_mean_pct"] is not None
        assert row["conditions"]["gpu_error"] and row["conditions"]["gpu_clock_share"] is None


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
    defaults = {"source": "defaults", "fp32": "16x64x1w", "split": "16x64x1w",
                "verify": "fp32 16x64x1w, split 16x64x1w", "fold": "fp32 16x4w, split 16x4w",
                "gdn": GDN_DEFAULT.as_key(),
                "native_batches": "fp32 <= 0, split <= 0, gdn fp32 <= 0, gdn split <= 0"}  # fmt: skip
    assert [r["launch_shapes"] for r in rows] == [None, defaults, defaults]
    assert all(r["valid"] and r["problems"] == [] and r["exact"] and r["preemptions"] == 0 for r in rows)
    assert all(r["engine_tpot_ms"] > 0 and r["engine_tpot_tokens"] == 272 for r in rows)
    assert len(saved["commands"]) == 2 and saved["machine"]["vllm"] == "0.24.0"
    assert all(r["cpu_model"] == saved["machine"]["cpu_model"] != "" for r in rows), "each row names its host's CPU"


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
    """`--batches fit`: a graph at every multiple of 32 up to --max-num-seqs, then the largest of them within vLLM's
    maximum concurrency (70.5 -> 64), so its steps run a graph of their own size."""
    fit = engine_flow["fit"]
    ladder = ", ".join(str(batch) for batch in range(32, 257, 32))
    assert fit["exit"] == 0 and fit["kwargs"]["compilation_config"].endswith(f"'cudagraph_capture_sizes': [{ladder}]}}")
    assert {c["batch"] for c in fit["calls"]} == {64}
    (row,) = engine_flow["fit_steps_file"]["rows"]
    assert (row["batch"], row["max_concurrency"], row["valid"]) == (64, 70.5, True) and row["window_steps"] > 200


def test_churn_step_keeps_the_batch_whole_and_splits_mixed_from_decode_steps(engine_flow):
    """churn_step.main against the stand-in engine, whose clock takes 40 ms for a step that admits a prefill and
    5 ms for one that only decodes: with 4 requests of 8 tokens each replaced as it finishes, every measured step
    serves all 4, the mixed and decode-only means read those clocks exactly, and the mean step is their mix."""
    churn = engine_flow["churn"]
    assert churn["exit"] == 0
    assert all(c["min_tokens"] == c["max_tokens"] and c["ignore_eos"] for c in churn["calls"])
    (row,) = engine_flow["churn_file"]["rows"]
    assert (row["variant"], row["batch"], row["prompt_tokens"], row["output_tokens"]) == ("replayssm_fp32", 4, 1024, 8)
    assert row["valid"] and row["problems"] == [] and row["steps"] == 40 and len(row["repeats"]) == 2
    assert (row["mixed_step_ms"], row["decode_step_ms"]) == (40.0, 5.0)
    assert 0 < row["mixed_share"] < 1
    assert row["step_ms"] == pytest.approx(row["mixed_share"] * 40 + (1 - row["mixed_share"]) * 5, abs=0.01)
    # 4 tokens per step (one per request) over the mean step
    assert row["tokens_per_s"] == pytest.approx(4 / row["step_ms"] * 1e3, rel=1e-3)
    assert all(r["fewest_rows"] == 4 for r in row["repeats"])
    # each repeat keeps what the machine did meanwhile (no nvidia-smi here: the host alone, and why)
    assert engine_flow["churn_telemetry"] == [f"replayssm_fp32-O0-b4-r{k}.json" for k in (0, 1)]
    for repeat in row["repeats"]:
        conditions = repeat["conditions"]
        assert conditions["samples"] >= 1 and conditions["cpu_busy_mean_pct"] is not None
        assert conditions["gpu_error"] and conditions["gpu_clock_share"] is None and "engine_rss_mib" in conditions
    assert "churn_step" in engine_flow["churn_file"]["command"]


def test_churn_host_profile_names_the_candidates_extra_host_work_in_mixed_steps(engine_flow):
    """churn_host_profile.main for the baseline, then the candidate, on the stand-in engine whose plugin-on arm sleeps
    2 ms in every mixed step: both rows read the stand-in clock's steps, and the candidate's extra host time is that
    function, called once per mixed step."""
    assert engine_flow["host_churn_baseline"]["exit"] == engine_flow["host_churn_candidate"]["exit"] == 0
    rows = {r["variant"]: r for r in engine_flow["host_churn_file"]["rows"]}
    assert set(rows) == {"baseline", "replayssm_fp32"}
    for row in rows.values():
        assert (row["batch"], row["steps"], row["output_tokens"]) == (4, 40, 8)
        assert (row["decode_step_ms"], row["mixed_step_ms"]) == (5.0, 40.0)
        assert row["profiled_step_ms"] == row["step_ms"]  # the stand-in's clock does not slow under cProfile
        assert len(row["gc_per_step"]["collections"]) == len(row["gc_per_step"]["ms"]) == 3
        assert row["allocator_per_step"] is None  # the stand-in engine runs on the CPU
    candidate, baseline = rows["replayssm_fp32"], rows["baseline"]
    names = [f[0] for f in candidate["functions"]]
    (work,) = [n for n in names if n.endswith("(candidate_mixed_step_work)")]
    assert not any(f[0] == work for f in baseline["functions"])
    share = candidate["mixed_share"]
    (calls,) = [f[3] for f in candidate["functions"] if f[0] == work]
    assert calls == pytest.approx(share, abs=0.03), "one call per mixed step"
    by_self = arm_difference(candidate, baseline, "self_us")
    assert "time.sleep" in by_self[0]["function"], "the candidate's own extra: its sleep"
    expected = 2000 * share  # µs per step: a sleep may overrun on a loaded machine, never fall short
    # time.sleep's self time is differenced against the baseline's own sleeps (the stand-in's step clock), which
    # overrun too on a loaded machine: a looser floor there (a clean clone beside compile jobs measured 0.93x)
    assert expected * 0.8 <= by_self[0]["extra_us"] <= expected * 2.5
    by_total = {f["function"]: f["extra_us"] for f in arm_difference(candidate, baseline, "total_us")}
    assert expected * 0.95 <= by_total[work] <= expected * 2.5  # the candidate's alone: nothing to difference
    md = engine_flow["host_churn_md"]
    assert "## replayssm_fp32 over the baseline, O0 batch 4: " in md and md.count("over the baseline") == 1


def test_churn_host_profile_splits_host_time_by_the_kind_of_engine_call(engine_flow):
    """Each measured call is profiled on its own and counted as "mixed" when it or the next call admitted a prompt:
    the stand-in's candidate-only sleep in its mixed steps lands in the mixed calls alone, at most once per call."""
    rows = {r["variant"]: r for r in engine_flow["host_churn_file"]["rows"]}
    candidate, baseline = rows["replayssm_fp32"], rows["baseline"]
    for row in rows.values():
        kinds = row["by_kind"]
        assert set(kinds) == {"mixed", "decode"} and kinds["mixed"]["calls"] + kinds["decode"]["calls"] == 41
        assert kinds["mixed"]["calls"] >= row["mixed_share"] * 40
    work = "candidate_mixed_step_work"
    mixed = {f[0]: f for f in candidate["by_kind"]["mixed"]["functions"] if f[0].endswith(f"({work})")}
    assert not any(f[0].endswith(f"({work})") for f in candidate["by_kind"]["decode"]["functions"])
    ((_, _, total_us, calls),) = mixed.values()
    assert 0.3 <= calls <= 1.0 and total_us >= 2000 * calls * 0.95  # a sleep may overrun, never fall short
    mixed_calls = (candidate["by_kind"]["mixed"], baseline["by_kind"]["mixed"])
    extra = {f["function"]: f["extra_us"] for f in arm_difference(*mixed_calls, "total_us")}
    assert extra[next(iter(mixed))] == total_us  # absent from the baseline's calls
    assert "### mixed calls (" in engine_flow["host_churn_md"] and "### decode calls (" in engine_flow["host_churn_md"]


def test_churn_step_profiles_its_decode_only_and_mixed_steps_apart(engine_flow):
    """--profile-out: one more churn run under the profiler, started once the warm-up is over (the trace's batch
    is the churn's 4), summarised twice into step_profile.json: the decode-only steps at 4 and the mixed ones."""
    rows = {r["step_kind"]: r for r in engine_flow["churn_profile_file"]["rows"]}
    assert set(rows) == {"decode", "mixed"}
    # decode-only steps at 4 and the one at 3 whose replacement had not joined yet (within replacement_gap)
    assert (rows["decode"]["batch"], rows["decode"]["steps"], rows["mixed"]["steps"]) == (4, 21, 5)
    assert "error" not in rows["decode"] and "error" not in rows["mixed"]
    assert rows["mixed"]["host_calls"]["graph_launches"]["per_step"] == 1.0
    assert "replayssm_fp32 (mixed steps)" in engine_flow["churn_profile_md"]
    assert engine_flow["churn_traces_left"] == []  # traces are removed once summarised
