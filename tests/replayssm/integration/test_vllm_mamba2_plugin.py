"""The Mamba-2 plugin inside real vllm==0.24.0 (CPU venv from tools/vllm_venv.sh, built once and cached).

The entry point, disabled-is-vLLM, layer specs, whole-model builds, the real builder's plans and refusals
(vllm_checks.py); ReplayMambaMixer2 against vLLM's MambaMixer2 step by step, in the native regime and at
start-up (vllm_layer_check.py) and under speculative verify (vllm_spec_layer_check.py); and that the plugin's
vLLM-free parts still import in the main venv.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.replayssm.integration.check_runner import VLLM_VENV_MARKS, run_check
from tests.replayssm.integration.native_regime import assert_native_regime

pytestmark = VLLM_VENV_MARKS


@pytest.fixture(scope="module")
def checks(vllm_python, tmp_path_factory) -> dict:
    return run_check(
        vllm_python, tmp_path_factory.mktemp("vllm"), "vllm_checks.py", ["nemotron_h_8b", "nemotron_h_tiny"]
    )


@pytest.fixture(scope="module")
def layer_check(vllm_python, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("vllm_layer")
    return run_check(
        vllm_python,
        root,
        "vllm_layer_check.py",
        ["nemotron_h_tiny_fp32"],
        TRITON_INTERPRET="1",
        CUDA_VISIBLE_DEVICES="",
    )


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


def test_native_mixed_steps_fold_decode_rows_and_hand_the_step_to_vllm(layer_check):
    """native_mixed_steps with no native batch limit: decode-only steps replay; the step with a prefill is native,
    its decode rows' two ring entries each folded by the builder (their cursors restart), so the next decode-only
    step replays from write position 0; a step of one-token rows (a new one-token prompt among them) may replay the
    decode graph, so it stays in the replay regime."""
    assert layer_check["native_mixed_flags"] == [
        {"native": False, "transition": None, "write_pos": [0, 0]},
        {"native": False, "transition": None, "write_pos": [1, 1]},
        {"native": True, "transition": [2, 2], "write_pos": None},
        {"native": False, "transition": None, "write_pos": [0, 0]},
        {"native": False, "transition": None, "write_pos": [1, 1]},  # one-token rows: the replay regime's graph
    ]


def test_native_regime_runs_vllms_own_decode_between_replay_steps(layer_check):
    """native_max_batch 2 (fp32), the Mamba-2 layer against vLLM's with the fp64 SSU; the second KV-cache group
    (vLLM's update_block_table) folds the same rows at its own blocks at each transition, so it answers exactly as
    the first."""
    assert_native_regime(layer_check["native"], output_tolerance=1e-5, state_tolerance=1e-5)


def test_split_precision_native_steps_leave_no_stale_copy_behind(layer_check):
    """native_max_batch 2 (split): vLLM's path writes the fp32 master only, so each native row's next replay step
    flushes from the master and rewrites the bf16 copy; outputs stay within the copy's rounding of vLLM's."""
    assert_native_regime(layer_check["native_split"], output_tolerance=1e-2, state_tolerance=1e-5, split=True)


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
    return run_check(vllm_python, root, "vllm_spec_layer_check.py", ["nemotron_h_tiny_fp32"], TRITON_INTERPRET="1",
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
    assert_verify_matches_vllm(spec_layer)


# the session-29 launch knobs as a launch table sets them: the verify's checkpoint tiles as TMA copies through a
# descriptor of vLLM's own cache view, two heads walked by each output program, the fold on 2 warps over d_state
# slices (the tiny model's d_state is one slice of 16)
NEW_KNOBS = {
    "verify_step": {"fp32": {"block_p": 16, "block_n": 16, "num_warps": 1, "mma_stages": 2, "heads_per_program": 2,
                             "tma": 1}},
    "fold": {"fp32": {"block_p": 16, "num_warps": 2, "prefetch": True, "programs_per_sm": 6, "block_n": 16}},
}  # fmt: skip


@pytest.fixture(scope="module")
def spec_layer_new_knobs(vllm_python, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("vllm_spec_layer_new_knobs")
    return run_check(vllm_python, root, "vllm_spec_layer_check.py", ["nemotron_h_tiny_fp32"], TRITON_INTERPRET="1",
                     CUDA_VISIBLE_DEVICES="", SPEC_CHECK_LAUNCH_TABLE=json.dumps(NEW_KNOBS))  # fmt: skip


def test_spec_verify_with_tma_copies_walked_heads_and_sliced_folds_matches_vllms_layer(spec_layer_new_knobs):
    """The same steps through vLLM's real builders and paged cache, with the launch knobs a kernel-bench table may
    set: the outputs and the folded checkpoint agree with vLLM's layer as the default launches' do."""
    assert spec_layer_new_knobs["launch_shapes"] == {
        "verify": "fp32 16x16x1w mma 2 stages 2 heads tma, split 16x64x1w",
        "fold": "fp32 16x2w n16 prefetch 6/SM, split 16x4w",
    }, "the steps ran the table's knobs"
    assert_verify_matches_vllm(spec_layer_new_knobs)


def assert_verify_matches_vllm(spec_layer: dict) -> None:
    """Every verify output within 1e-5 of vLLM's, folds under every acceptance pattern, rejected tokens rolled back
    (+1 entry a step), every verify within the ring, and the checkpoint after the final fold within 1e-5."""
    assert len(spec_layer["output_rel_err"]) == 10 and max(spec_layer["output_rel_err"]) <= 1e-5
    plans = spec_layer["plans"]
    assert plans[0] == {"accepted": [1, 1, 1], "write_pos": [0, 0, 0], "fold_len": [0, 0, 0]}  # after the prefill
    assert sum(f > 0 for p in plans for f in p["fold_len"]) >= 6  # folds under every pattern
    assert plans[4]["write_pos"] == [1, 1, 1] and plans[5]["write_pos"] == [2, 2, 2]  # all rejected: +1 per step
    assert all(w + 4 <= 8 for p in plans for w in p["write_pos"])
    assert spec_layer["state_rel_err_after_fold"] <= 1e-5


def test_spec_later_kv_cache_groups_take_the_first_groups_verify_plan(spec_layer):
    """Under speculation vLLM's own builder turns update_block_table off; ReplaySSM's keeps it, so vLLM builds the
    first group and derives the others: the second group's layer, at its own blocks, answers every verify token as
    the first group's bit for bit and ends at the same checkpoint, with no cursor table of its own and the one set of
    plan buffers. ``per_group_builds`` turns it off again, each group with its own buffers."""
    got = spec_layer["other_group"]
    assert got["shares"] and got["outputs_equal"] == [True] * 10 and got["states_equal"]
    assert got["own_table"] is False and got["same_plan_buffers"]
    assert spec_layer["per_group_builds"] == {"shares": False, "own_plan_buffers": True}


def test_spec_capture_builds_are_dry_runs(spec_layer):
    assert spec_layer["capture"] == {"write_pos": [0, 0, 0], "fold_len": [0, 0, 0], "table_allocated": False}
    assert spec_layer["recapture_moved_cursors"] is False


def test_spec_verify_never_takes_the_native_regime(spec_layer):
    """The check runs under a launch table whose native limit (8) covers its 3 rows: under speculation the limit is
    0 (a verify row is not vLLM's one-token decode), and the verify steps above are ReplaySSM's."""
    assert spec_layer["native_limit"] == 0


def test_main_venv_stays_free_of_vllm():
    """The plugin's vLLM-free parts import without vLLM (register() is only called by vLLM)."""
    code = "import replayssm_patch, replayssm_patch.config, replayssm_patch.cursors, replayssm_patch.refusals"
    code += ", replayssm_patch.state_layout"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
