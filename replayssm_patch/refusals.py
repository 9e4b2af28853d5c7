"""Settings ReplaySSM does not support yet: refuse at start-up with one clear line instead of wrong output.

Each check reads only public ``VllmConfig`` fields, so it is a pure function of the config (testable on CPU).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from replayssm_patch.config import replayssm_config_of

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's logger: the refusal shows like its own lines

# Drafting methods whose target-side steps the Mamba-2 verify serves (vLLM 0.24 SpeculativeConfig.method values:
# MTP model types resolve to "mtp"). They differ only in the drafter; the target sees 1..1+k tokens per row.
SPEC_METHODS = ("mtp", "eagle", "eagle3", "ngram", "ngram_gpu", "draft_model", "custom_class")
# vLLM 0.24 sizes these models' state pages without the speculative conv widening (their
# get_mamba_state_shape_from_config does not pass num_spec), so a spec server's pages are wrong with or without us.
SPEC_MISSIZED_ARCHITECTURES = ("FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM", "Zamba2ForCausalLM")


class ReplaySSMRefused(RuntimeError):
    """The server was started with ReplaySSM enabled together with a setting it cannot honour."""


def _engine_reasons(vllm_config: Any) -> list[str]:
    """Settings neither layer family supports: state stored or shipped outside the checkpoint and ring."""
    reasons: list[str] = []
    mode = getattr(vllm_config.cache_config, "mamba_cache_mode", "none")
    if mode != "none":
        reasons.append(
            f"mamba prefix caching mode {mode!r} stores per-block states the ring does not fill; "
            "start without --enable-prefix-caching (mamba_cache_mode 'none')"
        )
    if getattr(vllm_config, "kv_transfer_config", None) is not None:
        reasons.append("KV transfer would ship checkpoints without their rings; drop --kv-transfer-config")
    if getattr(vllm_config, "use_v2_model_runner", False):
        reasons.append("the V2 model runner is not supported; unset VLLM_USE_V2_MODEL_RUNNER")
    return reasons


def _speculation_reasons(vllm_config: Any) -> list[str]:
    """Speculative settings the Mamba-2 verify does not serve (empty without speculative decoding)."""
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None:
        return []
    reasons: list[str] = []
    method = getattr(spec, "method", None)
    if method not in SPEC_METHODS:
        reasons.append(
            f"speculative method {method!r} is not supported with ReplaySSM; use one of {', '.join(SPEC_METHODS)}"
        )
    if getattr(spec, "parallel_drafting", False):
        reasons.append("parallel drafting is not supported with ReplaySSM; drop parallel_drafting")
    if getattr(spec, "num_speculative_tokens_per_batch_size", None):
        reasons.append(
            "dynamic speculative decoding changes T at run time, which the ring is sized for; "
            "drop num_speculative_tokens_per_batch_size"
        )
    if getattr(spec, "disable_padded_drafter_batch", False):
        reasons.append("unpadded drafter batches are not supported with ReplaySSM; drop disable_padded_drafter_batch")
    architecture = getattr(getattr(vllm_config, "model_config", None), "architecture", None)
    if architecture in SPEC_MISSIZED_ARCHITECTURES:
        reasons.append(
            f"vLLM 0.24 sizes {architecture}'s state without the speculative conv window; "
            "drop --speculative-config for this model"
        )
    return reasons


def unsupported_settings(vllm_config: Any, split_precision: bool) -> list[str]:
    """Why this server config cannot run ReplaySSM on Mamba-2 layers (empty when it can), one fix per reason."""
    reasons = _engine_reasons(vllm_config) + _speculation_reasons(vllm_config)
    mamba = getattr(vllm_config, "mamba_config", None)
    backend = getattr(getattr(mamba, "backend", None), "name", "TRITON")
    if backend != "TRITON":
        reasons.append(f"the {backend} mamba backend is not wrapped; use the default Triton mamba backend")
    ssm_dtype = str(getattr(vllm_config.cache_config, "mamba_ssm_cache_dtype", "auto"))
    if split_precision and ssm_dtype != "float32":
        reasons.append(
            "split_precision keeps an fp32 master beside a bf16 copy; start with --mamba-ssm-cache-dtype float32"
        )
    if replayssm_config_of(vllm_config).native_mixed_steps and getattr(vllm_config, "speculative_config", None):
        reasons.append("native_mixed_steps is not implemented for speculative verify rows; drop one of the two")
    return reasons


def gdn_unsupported_settings(vllm_config: Any, ssm_dtype: torch.dtype, on_cuda: bool) -> list[str]:
    """Why this server config cannot run ReplaySSM on Gated DeltaNet layers (empty when it can).

    ``ssm_dtype`` is the GDN state dtype vLLM resolved for the model; ``on_cuda`` whether vLLM runs its CUDA
    forward (the CPU, XPU and ROCm forwards of the layer bypass the core op the plugin overrides).
    """
    reasons = _engine_reasons(vllm_config)
    if getattr(vllm_config, "speculative_config", None) is not None:
        reasons.append(
            "speculative decoding on Gated DeltaNet layers is not implemented yet; drop --speculative-config"
        )
    if ssm_dtype != torch.float32:
        dtype = str(ssm_dtype).removeprefix("torch.")
        reasons.append(
            f"the Gated DeltaNet checkpoint must be fp32 (vLLM resolved {dtype}); "
            "start with --mamba-ssm-cache-dtype float32"
        )
    if not on_cuda:
        reasons.append(
            "only vLLM's CUDA forward of the Gated DeltaNet layer is wrapped (its CPU, XPU and ROCm forwards are "
            "not); run on an NVIDIA GPU or drop the replayssm knob"
        )
    return reasons


def refuse_unsupported(vllm_config: Any, split_precision: bool) -> None:
    """Log one line and stop start-up if any setting is unsupported (Mamba-2 layers)."""
    refuse(unsupported_settings(vllm_config, split_precision))


def refuse(reasons: list[str]) -> None:
    """Log one line and stop start-up if there is any reason."""
    if reasons:
        message = "ReplaySSM refused: " + "; ".join(reasons)
        logger.error(message)
        raise ReplaySSMRefused(message)
