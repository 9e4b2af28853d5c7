"""Model classes whose state-shape/dtype classmethods size vLLM's mamba page for the ReplaySSM layout.

vLLM computes the mamba page size (and pads the attention block to it) from these classmethods before
any layer exists; the layer's KV-cache spec must then produce the same page. Both append the same
tensors through ``state_layout``. Disabled, every method returns vLLM's value unchanged and no layer
class is replaced. Registered lazily by name in ``replayssm_patch.register`` (no import cost there).
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.model_executor.models.falcon_h1 import FalconH1ForCausalLM
from vllm.model_executor.models.granitemoehybrid import GraniteMoeHybridForCausalLM
from vllm.model_executor.models.mamba2 import Mamba2ForCausalLM
from vllm.model_executor.models.nemotron_h import NemotronHForCausalLM
from vllm.model_executor.models.zamba2 import Zamba2ForCausalLM

from replayssm_patch.config import ReplaySSMConfig, replayssm_config_of, verify_len_of
from replayssm_patch.refusals import refuse_unsupported
from replayssm_patch.state_layout import replay_state_dtypes, replay_state_shapes


def active_config(vllm_config: Any) -> ReplaySSMConfig:
    """The knobs of this server; refuses unsupported settings when enabled."""
    config = replayssm_config_of(vllm_config)
    if config.enable:
        refuse_unsupported(vllm_config, config.split_precision)
    return config


class ReplaySSMModelMixin:
    """Put first in the bases: ``super()`` is the vLLM model class."""

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        config = active_config(vllm_config)
        if config.enable:
            from replayssm_patch.mixer import install_replay_mixer

            install_replay_mixer(config)  # before super().__init__ builds the MambaMixer2 layers
        super().__init__(vllm_config=vllm_config, prefix=prefix)  # type: ignore[call-arg]

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: Any) -> tuple[tuple[int, ...], ...]:
        stock = super().get_mamba_state_shape_from_config(vllm_config)  # type: ignore[misc]
        config = active_config(vllm_config)
        if not config.enable:
            return stock
        return replay_state_shapes(stock, config, is_conv_state_dim_first(), verify_len_of(vllm_config))

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: Any) -> tuple[torch.dtype, ...]:
        stock = super().get_mamba_state_dtype_from_config(vllm_config)  # type: ignore[misc]
        config = active_config(vllm_config)
        return replay_state_dtypes(stock, vllm_config.model_config.dtype, config) if config.enable else stock


class ReplayNemotronHForCausalLM(ReplaySSMModelMixin, NemotronHForCausalLM):
    pass


class ReplayFalconH1ForCausalLM(ReplaySSMModelMixin, FalconH1ForCausalLM):
    pass


class ReplayGraniteMoeHybridForCausalLM(ReplaySSMModelMixin, GraniteMoeHybridForCausalLM):
    pass


class ReplayZamba2ForCausalLM(ReplaySSMModelMixin, Zamba2ForCausalLM):
    pass


class ReplayMamba2ForCausalLM(ReplaySSMModelMixin, Mamba2ForCausalLM):
    pass
