"""The Gated DeltaNet plugin inside real vllm==0.24.0 (CPU venv from tools/vllm_venv.sh, built once and cached).

The replay step against vLLM's own GDN decode kernels (vllm_gdn_kernel_check.py); disabled-is-vLLM, layer
specs, refusals, the native regime, the real builder's plans, mixed steps' one-launch decode rows and whole-model
builds for Qwen3.5 (vllm_gdn_checks.py); and `replayssm_patch.gpu.gdn_layer_check`, the GPU host's layer check,
in its CPU smoke mode and without a GPU.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.replayssm.integration.check_runner import HERE, REPO, VLLM_VENV_MARKS, run_check, run_with_timeout
from tests.replayssm.integration.native_regime import assert_native_regime

pytestmark = VLLM_VENV_MARKS


@pytest.fixture(scope="module")
def gdn_kernels(vllm_python, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("vllm_gdn_kernels")
    return run_check(vllm_python, root, "vllm_gdn_kernel_check.py", [], TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")


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


@pytest.fixture(scope="module")
def gdn_checks(vllm_python, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("vllm_gdn")
    return run_check(vllm_python, root, "vllm_gdn_checks.py", ["qwen3_5_4b", "qwen3_5_tiny"],
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
        ("prefix_caching", "mamba prefix caching mode 'align'"),
    ],
)
def test_gdn_unsupported_settings_are_refused_from_real_configs(gdn_checks, case, needle):
    refused = gdn_checks["refused"][case]
    assert refused.startswith("ReplaySSMRefused: ReplaySSM refused: ") and needle in refused


def test_gdn_fp32_state_on_cuda_is_accepted(gdn_checks):
    assert gdn_checks["refused"]["fp32_supported"] is None
    assert gdn_checks["refused"]["split_precision"] is None  # with the flush's exact replay
    assert gdn_checks["refused"]["native_mixed_steps"] is None  # the knob is Gated DeltaNet's
    assert gdn_checks["refused"]["split_native_mixed"] is None  # stale copies flush at their next replay step


def test_gdn_split_precision_spec_adds_beta_values_and_the_bf16_copy(gdn_checks):
    """Qwen3.5-4B shape, L=16, after the fp32 ring: β [16, 32] fp32, raw v [16, 32, 128] in the model dtype (bf16)
    and the copy [32, 128, 128] bf16; the layer's spec is the model classmethods'."""
    got = gdn_checks["split"]
    assert got["spec"] == got["model_spec"]
    assert got["spec"]["shapes"][2:] == [[16, 16, 128], [16, 32, 128], [16, 32], [16, 32], [16, 32, 128],
                                         [32, 128, 128]]  # fmt: skip
    assert got["spec"]["dtypes"][2:] == ["torch.float32"] * 4 + ["torch.bfloat16"] * 2
    fp32_ring = 4 * 16 * (16 * 128 + 32 * 128 + 32)
    assert got["spec"]["page_size_bytes"] == 2146304 + fp32_ring + 4 * 16 * 32 + 2 * 16 * 32 * 128 + 2 * 32 * 128 * 128


def test_gdn_split_precision_keeps_the_copy_current_and_every_step_on_the_replay(gdn_checks):
    """No native batches without a measured split limit (none on the CPU); a new one-token prompt's copy is zeroed
    with its checkpoint; after vLLM's prefill the layer copies the prefill rows' checkpoints, and only theirs."""
    got = gdn_checks["split"]
    assert got["native_max_batch"] == 0
    assert got["fresh"] == {"copy_zeroed": True, "other_copy_kept": True}
    assert got["copy_after_prefill"] and got["decode_copy_untouched"]


def test_gdn_native_mixed_steps_fold_decode_rows_and_run_vllms_own_path(gdn_checks):
    """native_mixed_steps: after two decode steps (two ring entries per row) a step with a prefill is native: the
    builder folds both decode rows' entries into the checkpoint and restarts their cursors, the layer gets no
    prefill-only view (vLLM's path takes the whole step); the next decode-only step replays from write position 0."""
    got = gdn_checks["native_mixed"]
    assert (got["mixed_native"], got["transition"], got["prefill_view"]) == (True, [2, 2], False)
    assert got["cursors_after_mixed"][3] == 0 and got["cursors_after_mixed"][5] == 0 and got["checkpoint_folded"]
    assert (got["decode_native"], got["decode_write_pos"]) == (False, [0, 0])


def test_gdn_native_regime_runs_vllms_own_decode_between_replay_steps(gdn_checks):
    """gdn_native_max_batch 2, the GDN layer against vLLM's packed decode (interpreted); a layer of a second
    KV-cache group, at other blocks, takes the first group's metadata through update_block_table and is folded
    at each transition by its own builder, so it answers exactly as the first."""
    assert_native_regime(gdn_checks["native"], output_tolerance=1e-5, state_tolerance=1e-6)


def test_gdn_split_precision_native_steps_leave_no_stale_copy_behind(gdn_checks):
    """gdn_native_max_batch 2 (split): vLLM's path writes the fp32 master only, so each native row's next replay
    step flushes (the window replayed exactly on the master) and rewrites the bf16 copy."""
    assert_native_regime(gdn_checks["native_split"], output_tolerance=2**-6, state_tolerance=1e-5, split=True)


def test_gdn_later_groups_take_the_first_groups_plan_at_their_own_blocks(gdn_checks):
    """vLLM builds the first GDN group and hands its metadata to the others (update_block_table): one cursor table
    and one set of plan buffers; each group's decode-only indices go into its own persistent buffer (what its
    captured graphs read), padded with the null block, at block slot + 4."""
    got = gdn_checks["native"]
    assert not got["twin_cursor_table"]  # the cursors moved once per step, in the first group's build
    assert all(step["shared_plan"] and step["own_buffer"] for step in got["twin_groups"])
    assert [step["indices"] for step in got["twin_groups"]][:4] == [[5, 6, 7], [5, 6, 7], [5, 6, 7], [5, 6]]


def test_gdn_later_group_gets_its_own_prefill_view_and_zeroes_its_fresh_rows(gdn_checks):
    """The mixed step of the builder checks at a second group's blocks 2, 1, 4: its prefill rows and vLLM's
    prefill-only view name its own blocks, with the first group's pending counts; a new one-token prompt's state
    is zeroed in the second group's layers too, and only there."""
    got = gdn_checks["builder"]["other_group"]
    assert got["supported"] and got["indices"] == [2, 1, 4]
    assert got["prefill_indices"] == got["view_indices"] == [1, 4] and got["first_view_indices"] == [5, 6]
    assert (got["pending"], got["view_tokens"]) == ([1, 0], 12)
    assert got["fresh_state_zero"] and got["decoding_state_kept"]
    assert got["per_group_builds"] == {"shares": False, "own_plan": True}  # the knob: the same-host control arm


def test_gdn_builder_plans_capture_and_decode_with_its_own_cursor_table(gdn_checks):
    steps = gdn_checks["builder"]["steps"]
    # capture touched no cursor and lists no row to fold; it compiled the eager kernels on the null block (the
    # materialise fold and the one-launch mixed-step decode), which changed no state
    assert steps[0] == {"capture_write_pos": [0, 0], "table_allocated": False, "capture_flush_list": [],
                        "eager_kernels_warmed": True, "cache_unchanged": True}  # fmt: skip
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


@pytest.mark.parametrize("case", ["mixed_decode_rows", "mixed_decode_rows_split"])
def test_gdn_mixed_step_decode_rows_in_one_launch_equal_the_four_launch_path(gdn_checks, case):
    """Three decode-only steps, then three with a prefill beside the two decode rows (the first folds their rings):
    the one-launch path (conv inside) answers as vLLM's conv update plus the replay's three launches (observed
    <= 1e-7), shifts the same conv states bit for bit, appends the same ring entries (split precision: and the same
    β, raw v and copy) and folds the same states, and leaves the prefill rows' outputs to vLLM's path."""
    steps = gdn_checks[case]["steps"]
    assert [step["prefills"] for step in steps] == [0, 0, 0, 1, 1, 1]
    assert [step["flush_len"] for step in steps][3:] == [[4, 4], [0, 0], [0, 0]]
    for step in steps:
        assert step["rel_err"] <= 1e-6 and step["state_rel_err"] <= 1e-6
        assert step["conv_shifted"] and step["conv_state_equal"] and step["rings_equal"]
        assert step["prefill_rows_untouched"]


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
    ran = run_with_timeout(cmd, 600, env)
    assert ran.returncode == 0, f"gdn_layer_check --smoke failed:\n{ran.stdout[-3000:]}{ran.stderr[-3000:]}"
    assert "| worst output rel. error |" in (root / "out" / "gdn_layer_check.md").read_text()
    return json.loads((root / "out" / "gdn_layer_check.json").read_text())


@pytest.mark.parametrize("variant", ["fp32", "split"])
def test_gdn_layer_matches_vllms_own_decode_path_across_folds(gdn_layer_smoke, variant):
    """ReplayGatedDeltaNet._forward_core vs vLLM's (causal-conv update + packed recurrent decode, interpreted),
    both through their real builders on a paged cache: 9 steps with L=4 (two folds), realistic gates
    (observed <= 2.3e-7); the checkpoint after folding what the rings hold equals vLLM's state. In split precision
    outputs carry the bf16 copy's rounding (2^-6 bound, test_gdn_split_kernels.py) and the checkpoint does not."""
    got = gdn_layer_smoke[variant]
    assert (got["variant"], got["steps"], got["batch"], got["buffer_len"]) == (variant, 9, 3, 4)
    assert got["dtype"] == "torch.float32" and len(got["output_rel_err"]) == 9
    assert got["worst_output_rel_err"] <= (2**-6 if variant == "split" else 1e-5)
    # staggered first windows: each ring holds 0..L-1 entries after 9 steps, folded into the checkpoint below
    assert len(got["pending_before_fold"]) == 3 and all(0 <= n < 4 for n in got["pending_before_fold"])
    assert got["final_state_rel_err"] <= 1e-6 and got["conv_state_equal"]


def test_gdn_layer_check_without_a_gpu_or_interpreter_says_what_to_do(vllm_python, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("TRITON_INTERPRET", None)
    cmd = [str(vllm_python), "-m", "replayssm_patch.gpu.gdn_layer_check", "--model", str(tmp_path), "--out",
           str(tmp_path / "out")]  # fmt: skip
    ran = run_with_timeout(cmd, 300, env)
    assert ran.returncode == 2 and ran.stdout.strip().splitlines()[-1].startswith("error: no CUDA GPU")
