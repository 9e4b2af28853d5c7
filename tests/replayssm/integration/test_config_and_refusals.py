"""Knob parsing and the refusal rules (pure Python; vLLM configs stood in by their public field names)."""

from types import SimpleNamespace

import pytest
import torch

from replayssm_patch.config import (
    DISABLED,
    ReplaySSMConfig,
    ReplaySSMConfigError,
    parse_replayssm_config,
    replayssm_config_of,
    verify_len_of,
)
from replayssm_patch.refusals import (
    SPEC_METHODS,
    ReplaySSMRefused,
    gdn_unsupported_settings,
    refuse,
    refuse_unsupported,
    unsupported_settings,
)


def test_absent_or_empty_config_is_disabled():
    assert parse_replayssm_config(None) == DISABLED
    assert parse_replayssm_config({}) == DISABLED
    assert parse_replayssm_config({"other_plugin": 1}).enable is False


def test_full_config_parses():
    got = parse_replayssm_config({"replayssm": {"enable": True, "buffer_len": 8, "split_precision": True}})
    assert got == ReplaySSMConfig(enable=True, buffer_len=8, split_precision=True)
    assert parse_replayssm_config({"replayssm": {"native_mixed_steps": True}}).native_mixed_steps is True
    assert parse_replayssm_config({"replayssm": {"per_group_builds": True}}).per_group_builds is True
    assert DISABLED.gdn_one_launch_mixed is True
    assert parse_replayssm_config({"replayssm": {"gdn_one_launch_mixed": False}}).gdn_one_launch_mixed is False


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ("yes", "must be an object"),
        ({"enable": True, "bufer_len": 16}, "unknown replayssm option(s) ['bufer_len']"),
        ({"enable": "true"}, "replayssm.enable must be a JSON boolean"),
        ({"buffer_len": 16.0}, "replayssm.buffer_len must be a JSON integer"),
        ({"buffer_len": True}, "replayssm.buffer_len must be a JSON integer"),
        ({"buffer_len": 1}, "between 2 and 64"),
        ({"buffer_len": 65}, "between 2 and 64"),
    ],
)
def test_bad_config_names_the_problem(raw, needle):
    with pytest.raises(ReplaySSMConfigError) as info:
        parse_replayssm_config({"replayssm": raw})
    assert needle in str(info.value)


def _vllm_config(**overrides):
    fields = {
        "cache_config": SimpleNamespace(mamba_cache_mode="none", mamba_ssm_cache_dtype="float32"),
        "kv_transfer_config": None,
        "mamba_config": SimpleNamespace(backend=SimpleNamespace(name="TRITON")),
        "use_v2_model_runner": False,
        "speculative_config": None,
        "model_config": SimpleNamespace(architecture="NemotronHForCausalLM"),
    }
    fields.update(overrides)
    return SimpleNamespace(**fields)


def _spec(**overrides):
    """A SpeculativeConfig stand-in: MTP with k = 3 and vLLM 0.24's defaults for the fields the refusals read."""
    fields = {"method": "mtp", "num_speculative_tokens": 3, "parallel_drafting": False,
              "num_speculative_tokens_per_batch_size": None, "disable_padded_drafter_batch": False}  # fmt: skip
    fields.update(overrides)
    return SimpleNamespace(**fields)


def test_supported_config_passes():
    assert unsupported_settings(_vllm_config(), split_precision=True) == []
    mixed = _vllm_config(additional_config={"replayssm": {"enable": True, "native_mixed_steps": True}})
    assert unsupported_settings(mixed, split_precision=False) == []
    refuse_unsupported(_vllm_config(), split_precision=False)


@pytest.mark.parametrize(
    ("overrides", "split", "needle"),
    [
        ({"cache_config": SimpleNamespace(mamba_cache_mode="align", mamba_ssm_cache_dtype="float32")}, False,
         "mamba prefix caching mode 'align'"),
        ({"cache_config": SimpleNamespace(mamba_cache_mode="all", mamba_ssm_cache_dtype="float32")}, False,
         "mamba prefix caching mode 'all'"),
        ({"kv_transfer_config": object()}, False, "drop --kv-transfer-config"),
        ({"mamba_config": SimpleNamespace(backend=SimpleNamespace(name="FLASHINFER"))}, False,
         "FLASHINFER mamba backend"),
        ({"use_v2_model_runner": True}, False, "unset VLLM_USE_V2_MODEL_RUNNER"),
        ({"speculative_config": _spec(method="medusa")}, False,
         "speculative method 'medusa' is not supported with ReplaySSM; use one of mtp, eagle, eagle3, ngram"),
        ({"speculative_config": _spec(method="suffix")}, False, "speculative method 'suffix' is not supported"),
        ({"speculative_config": _spec(method="eagle", parallel_drafting=True)}, False, "drop parallel_drafting"),
        ({"speculative_config": _spec(num_speculative_tokens_per_batch_size=[(1, 64, 3), (65, 256, 1)])}, False,
         "drop num_speculative_tokens_per_batch_size"),
        ({"speculative_config": _spec(method="eagle", disable_padded_drafter_batch=True)}, False,
         "drop disable_padded_drafter_batch"),
        ({"speculative_config": _spec(), "model_config": SimpleNamespace(architecture="FalconH1ForCausalLM")}, False,
         "vLLM 0.24 sizes FalconH1ForCausalLM's state without the speculative conv window"),
        ({"speculative_config": _spec(), "model_config": SimpleNamespace(architecture="GraniteMoeHybridForCausalLM")},
         False, "GraniteMoeHybridForCausalLM's state"),
        ({"speculative_config": _spec(), "model_config": SimpleNamespace(architecture="Zamba2ForCausalLM")}, False,
         "drop --speculative-config for this model"),
        ({"cache_config": SimpleNamespace(mamba_cache_mode="none", mamba_ssm_cache_dtype="bfloat16")}, True,
         "--mamba-ssm-cache-dtype float32"),
        ({"additional_config": {"replayssm": {"enable": True, "native_mixed_steps": True}},
          "speculative_config": _spec()}, False, "native_mixed_steps is not implemented for speculative verify rows"),
    ],
)  # fmt: skip
def test_each_unsupported_setting_is_refused_with_one_line(overrides, split, needle, caplog):
    with pytest.raises(ReplaySSMRefused) as info:
        refuse_unsupported(_vllm_config(**overrides), split_precision=split)
    assert needle in str(info.value)
    assert str(info.value).startswith("ReplaySSM refused: ")
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "\n" not in errors[0].getMessage()


@pytest.mark.parametrize("method", SPEC_METHODS)
def test_speculative_methods_the_verify_serves_pass_on_mamba2(method):
    """The drafter differs, the target's verify rows do not: each method with k = 3 on Nemotron-H is accepted."""
    config = _vllm_config(speculative_config=_spec(method=method))
    assert unsupported_settings(config, split_precision=True) == []
    assert verify_len_of(config) == 4


@pytest.mark.parametrize(("tokens", "ring"), [(1, 30), (3, 28), (5, 26), (7, 24)])
def test_speculation_fills_the_verify_tile_unless_the_ring_length_is_given(tokens, ring):
    """L + T fills the power of two the kernels pad it to (k = 3: 28 + 4 = 32); a given buffer_len stays, and
    without speculation, or with the plugin off, the default is 16."""
    knobs = {"replayssm": {"enable": True}}
    speculating = _vllm_config(speculative_config=_spec(num_speculative_tokens=tokens), additional_config=knobs)
    assert replayssm_config_of(speculating).buffer_len == ring
    assert (ring + tokens + 1) & (ring + tokens) == 0, "a power of two"
    given = {"replayssm": {"enable": True, "buffer_len": 16}}
    assert replayssm_config_of(SimpleNamespace(**{**vars(speculating), "additional_config": given})).buffer_len == 16
    assert replayssm_config_of(_vllm_config(additional_config=knobs)).buffer_len == 16
    assert replayssm_config_of(_vllm_config(speculative_config=_spec(num_speculative_tokens=tokens))) == DISABLED


def test_verify_len_is_zero_without_speculation():
    assert verify_len_of(_vllm_config()) == 0
    assert verify_len_of(SimpleNamespace()) == 0


def test_gdn_fp32_state_on_cuda_passes_and_ignores_the_mamba_ssu_backend():
    """The Mamba SSU backend choice does not concern GDN layers (they never call it)."""
    config = _vllm_config(mamba_config=SimpleNamespace(backend=SimpleNamespace(name="FLASHINFER")))
    assert gdn_unsupported_settings(config, torch.float32, on_cuda=True) == []


def test_split_precision_beside_native_mixed_steps_is_served():
    """vLLM's own path leaves the bf16 copy stale; the builder has those rows flush at their next replay step."""
    config = _vllm_config(additional_config={"replayssm": {"enable": True, "native_mixed_steps": True}})
    assert unsupported_settings(config, split_precision=True) == []
    assert gdn_unsupported_settings(config, torch.float32, on_cuda=True) == []


@pytest.mark.parametrize(
    ("overrides", "ssm_dtype", "on_cuda", "needle"),
    [
        ({}, torch.bfloat16, True, "(vLLM resolved bfloat16); start with --mamba-ssm-cache-dtype float32"),
        ({}, torch.float32, False, "run on an NVIDIA GPU or drop the replayssm knob"),
        ({"speculative_config": _spec()}, torch.float32, True,
         "speculative decoding on Gated DeltaNet layers is not implemented yet; drop --speculative-config"),
        ({"kv_transfer_config": object()}, torch.float32, True, "drop --kv-transfer-config"),
        ({"use_v2_model_runner": True}, torch.float32, True, "unset VLLM_USE_V2_MODEL_RUNNER"),
        ({"cache_config": SimpleNamespace(mamba_cache_mode="align", mamba_ssm_cache_dtype="float32")},
         torch.float32, True, "mamba prefix caching mode 'align'"),
    ],
)  # fmt: skip
def test_each_unsupported_gdn_setting_is_refused_with_one_line(overrides, ssm_dtype, on_cuda, needle, caplog):
    with pytest.raises(ReplaySSMRefused) as info:
        refuse(gdn_unsupported_settings(_vllm_config(**overrides), ssm_dtype, on_cuda))
    assert needle in str(info.value) and str(info.value).startswith("ReplaySSM refused: ")
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "\n" not in errors[0].getMessage()
