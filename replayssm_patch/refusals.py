"""Settings ReplaySSM does not support yet: refuse at start-up with one clear line instead of wrong output.

Each check reads only public ``VllmConfig`` fields, so it is a pure function of the config (testable on CPU).
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's logger: the refusal shows like its own lines


class ReplaySSMRefused(RuntimeError):
    """The server was started with ReplaySSM enabled together with a setting it cannot honour."""


def unsupported_settings(vllm_config: Any, split_precision: bool) -> list[str]:
    """Why this server config cannot run ReplaySSM (empty when it can), one fix per reason."""
    reasons: list[str] = []
    cache = vllm_config.cache_config
    mode = getattr(cache, "mamba_cache_mode", "none")
    if mode != "none":
        reasons.append(
            f"mamba prefix caching mode {mode!r} stores per-block states the ring does not fill; "
            "start without --enable-prefix-caching (mamba_cache_mode 'none')"
        )
    if getattr(vllm_config, "kv_transfer_config", None) is not None:
        reasons.append("KV transfer would ship checkpoints without their rings; drop --kv-transfer-config")
    mamba = getattr(vllm_config, "mamba_config", None)
    backend = getattr(getattr(mamba, "backend", None), "name", "TRITON")
    if backend != "TRITON":
        reasons.append(f"the {backend} mamba backend is not wrapped; use the default Triton mamba backend")
    if getattr(vllm_config, "use_v2_model_runner", False):
        reasons.append("the V2 model runner is not supported; unset VLLM_USE_V2_MODEL_RUNNER")
    if getattr(vllm_config, "speculative_config", None) is not None:
        reasons.append("speculative decoding (rollback as a cursor move) is not implemented; drop it")
    if split_precision and str(getattr(cache, "mamba_ssm_cache_dtype", "auto")) != "float32":
        reasons.append(
            "split_precision keeps an fp32 master beside a bf16 copy; start with --mamba-ssm-cache-dtype float32"
        )
    return reasons


def refuse_unsupported(vllm_config: Any, split_precision: bool) -> None:
    """Log one line and stop start-up if any setting is unsupported."""
    reasons = unsupported_settings(vllm_config, split_precision)
    if reasons:
        message = "ReplaySSM refused: " + "; ".join(reasons)
        logger.error(message)
        raise ReplaySSMRefused(message)
