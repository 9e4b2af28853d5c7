"""Gated DeltaNet model classes (Qwen3-Next, Qwen3.5 dense and MoE) whose state classmethods size vLLM's
mamba page for the ReplaySSM ring, as ``models.py`` does for the Mamba-2 family.

A module of its own so that resolving a Mamba-2 model does not import the Qwen modules (Qwen3.5's needs
torchvision through transformers' image processors). Disabled, every method returns vLLM's value unchanged
and no layer class is replaced. Registered lazily by name in ``replayssm_patch.register``.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.model_executor.models.qwen3_5 import Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration
from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM

from replayssm_patch.config import ReplaySSMConfig, replayssm_config_of
from replayssm_patch.gdn_state_layout import gdn_replay_state_dtypes, gdn_replay_state_shapes
from replayssm_patch.refusals import gdn_unsupported_settings, refuse


class ReplayGDNModelMixin:
    """Put first in the bases: ``super()`` is the vLLM model class.

    ``vllm_config`` and ``prefix`` are named: vLLM 0.24's initialize_model passes them only to a class whose
    ``__init__`` names both, and calls any other the old way (seen on the H200: KeyError 'vllm_config' at start-up,
    baseline included). A prefix left out keeps the vLLM class's own default (Qwen3.5's differs from Qwen3-Next's).
    """

    def __init__(self, *, vllm_config: Any, prefix: str | None = None) -> None:
        config = self.active_config(vllm_config)
        if config.enable:
            from replayssm_patch.gdn_mixer import install_replay_gdn

            install_replay_gdn(config)  # before super().__init__ builds the GDN layers
        super().__init__(vllm_config=vllm_config, **({} if prefix is None else {"prefix": prefix}))  # type: ignore[call-arg]

    @classmethod
    def active_config(cls, vllm_config: Any) -> ReplaySSMConfig:
        """The knobs of this server; refuses unsupported settings when enabled."""
        config = replayssm_config_of(vllm_config)
        if config.enable:
            from vllm.platforms import current_platform

            _, ssm_dtype = super().get_mamba_state_dtype_from_config(vllm_config)  # type: ignore[misc]
            refuse(gdn_unsupported_settings(vllm_config, ssm_dtype, current_platform.is_cuda()))
        return config

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: Any) -> tuple[tuple[int, ...], ...]:
        stock = super().get_mamba_state_shape_from_config(vllm_config)  # type: ignore[misc]
        config = cls.active_config(vllm_config)
        return gdn_replay_state_shapes(stock, config, is_conv_state_dim_first()) if config.enable else stock

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: Any) -> tuple[torch.dtype, ...]:
        stock = super().get_mamba_state_dtype_from_config(vllm_config)  # type: ignore[misc]
        config = cls.active_config(vllm_config)
        return gdn_replay_state_dtypes(stock, vllm_config.model_config.dtype, config) if config.enable else stock


class ReplayQwen3NextForCausalLM(ReplayGDNModelMixin, Qwen3NextForCausalLM):
    pass


class ReplayQwen3_5ForConditionalGeneration(ReplayGDNModelMixin, Qwen3_5ForConditionalGeneration):
    pass


class ReplayQwen3_5MoeForConditionalGeneration(ReplayGDNModelMixin, Qwen3_5MoeForConditionalGeneration):
    pass
