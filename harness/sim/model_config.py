"""Read an HF-style `config.json` into the shapes the cost model needs (layers, bytes, parameters).

Only the sizes matter to the simulated engine, so this reads the fields that set them: the hybrid layer
pattern (Nemotron-H `hybrid_override_pattern`, Qwen3-Next `full_attention_interval` / `layer_types`),
attention heads, Mamba-2 and Gated DeltaNet dimensions, and dense-MLP or MoE sizes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import UserError

BF16_BYTES = 2
FP32_BYTES = 4


@dataclass(frozen=True)
class AttentionShape:
    """Grouped-query attention layers: they hold a KV cache that grows with the context."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int

    @property
    def params_per_layer(self) -> int:
        q_and_o = 2 * self.hidden * self.heads * self.head_dim
        k_and_v = 2 * self.hidden * self.kv_heads * self.head_dim
        return q_and_o + k_and_v

    @property
    def kv_bytes_per_token(self) -> int:
        """bf16 K and V of every attention layer for one token."""
        return self.layers * 2 * self.kv_heads * self.head_dim * BF16_BYTES


@dataclass(frozen=True)
class RecurrentShape:
    """Mamba-2 or Gated DeltaNet layers: a fixed-size state per sequence, updated every token.

    `step_input_bytes` is what ReplaySSM keeps per step in its ring: Mamba-2 post-conv x and B (bf16) and
    softplus'ed dt (fp32); Gated DeltaNet k and v (bf16) and beta and the gate g (fp32).
    """

    kind: str  # "mamba2" | "gated_deltanet"
    layers: int
    state_elements: int  # per layer per sequence
    conv_elements: int  # rolling conv window per layer per sequence (kept in bf16)
    step_input_bytes: int  # per layer per step
    params_per_layer: int


@dataclass(frozen=True)
class MlpShape:
    """Feed-forward blocks: dense (every parameter used by every token) or MoE (top-k of E experts)."""

    layers: int
    dense_params_per_layer: int  # dense MLP, or shared expert + router for MoE
    experts: int = 0
    experts_per_token: int = 0
    params_per_expert: int = 0


@dataclass(frozen=True)
class ModelShape:
    """Everything the cost model and the memory accounting need to know about a model."""

    name: str
    vocab_size: int
    hidden: int
    max_model_len: int
    attention: AttentionShape
    recurrent: RecurrentShape | None
    mlp: MlpShape

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden

    @property
    def dense_params(self) -> int:
        """Parameters every token uses: layers except routed experts, plus the LM head."""
        recurrent = self.recurrent.layers * self.recurrent.params_per_layer if self.recurrent else 0
        attention = self.attention.layers * self.attention.params_per_layer
        return recurrent + attention + self.mlp.layers * self.mlp.dense_params_per_layer + self.embedding_params

    @property
    def expert_params(self) -> int:
        return self.mlp.layers * self.mlp.experts * self.mlp.params_per_expert

    @property
    def total_params(self) -> int:
        """Input embedding + dense + all experts (the LM head is counted in `dense_params`)."""
        return self.embedding_params + self.dense_params + self.expert_params

    @property
    def active_params_per_token(self) -> int:
        return self.dense_params + self.mlp.layers * self.mlp.experts_per_token * self.mlp.params_per_expert

    @property
    def weight_bytes(self) -> int:
        return self.total_params * BF16_BYTES

    def weight_bytes_read(self, tokens: int) -> float:
        """Weight bytes one forward pass over `tokens` tokens reads (experts touched by at least one token)."""
        dense = self.dense_params * BF16_BYTES
        if not self.mlp.experts:
            return float(dense)
        untouched = (1.0 - self.mlp.experts_per_token / self.mlp.experts) ** max(tokens, 1)
        touched = self.mlp.experts * (1.0 - untouched)
        return dense + self.mlp.layers * touched * self.mlp.params_per_expert * BF16_BYTES

    @property
    def kv_bytes_per_token(self) -> int:
        return self.attention.kv_bytes_per_token


def load_model_shape(path: str | os.PathLike[str]) -> ModelShape:
    """Read a config file; an unreadable or unsupported config is a one-line `UserError`."""
    path = Path(path)
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(
            f"{path}: no such model config; give an HF-style config.json, e.g. configs/models/nemotron-h-8b.json"
        ) from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a readable JSON model config ({exc}); fix the file") from None
    try:
        return shape_from_config(config, name=path.stem)
    except KeyError as missing:
        raise UserError(f"{path}: model config lacks field {missing}; add it (see configs/models/)") from None


def shape_from_config(config: dict[str, Any], name: str) -> ModelShape:
    """Dispatch on `model_type`: Nemotron-H (Mamba-2 hybrid) or Qwen3-Next (Gated DeltaNet hybrid)."""
    model_type = config.get("model_type")
    if model_type == "nemotron_h":
        return _nemotron_h(config, name)
    if model_type == "qwen3_next":
        return _qwen3_next(config, name)
    raise UserError(
        f"model_type {model_type!r} is not supported by the simulated engine; use a nemotron_h or qwen3_next config"
    )


def _attention(config: dict[str, Any], layers: int) -> AttentionShape:
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return AttentionShape(
        layers=layers,
        heads=heads,
        kv_heads=config.get("num_key_value_heads", heads),
        head_dim=head_dim,
        hidden=config["hidden_size"],
    )


def _nemotron_h(config: dict[str, Any], name: str) -> ModelShape:
    pattern = config["hybrid_override_pattern"]
    if len(pattern) != config["num_hidden_layers"]:
        raise UserError(
            f"hybrid_override_pattern has {len(pattern)} layers but num_hidden_layers is "
            f"{config['num_hidden_layers']}; make them agree"
        )
    hidden = config["hidden_size"]
    heads, head_dim = config["mamba_num_heads"], config["mamba_head_dim"]
    d_state, groups, d_conv = config["ssm_state_size"], config["mamba_n_groups"], config["mamba_d_conv"]
    d_inner = heads * head_dim
    conv_channels = d_inner + 2 * groups * d_state
    in_proj = hidden * (2 * d_inner + 2 * groups * d_state + heads)
    mamba_params = in_proj + conv_channels * d_conv + 3 * heads + d_inner + d_inner * hidden + hidden
    recurrent = RecurrentShape(
        kind="mamba2",
        layers=pattern.count("M"),
        state_elements=heads * head_dim * d_state,
        conv_elements=(d_conv - 1) * conv_channels,
        step_input_bytes=(d_inner + groups * d_state) * BF16_BYTES + heads * FP32_BYTES,
        params_per_layer=mamba_params,
    )
    gated = config.get("mlp_hidden_act", "relu2") in ("silu", "swiglu")
    mlp = MlpShape(
        layers=pattern.count("-"),
        dense_params_per_layer=(3 if gated else 2) * hidden * config["intermediate_size"] + hidden,
    )
    return ModelShape(
        name=name,
        vocab_size=config["vocab_size"],
        hidden=hidden,
        max_model_len=config.get("max_position_embeddings", 4096),
        attention=_attention(config, pattern.count("*")),
        recurrent=recurrent,
        mlp=mlp,
    )


def _qwen3_next_layer_types(config: dict[str, Any]) -> list[str]:
    if config.get("layer_types"):
        return list(config["layer_types"])
    interval = config["full_attention_interval"]
    return [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(config["num_hidden_layers"])
    ]


def _qwen3_next(config: dict[str, Any], name: str) -> ModelShape:
    hidden = config["hidden_size"]
    types = _qwen3_next_layer_types(config)
    k_heads, v_heads = config["linear_num_key_heads"], config["linear_num_value_heads"]
    k_dim, v_dim, kernel = (
        config["linear_key_head_dim"],
        config["linear_value_head_dim"],
        config["linear_conv_kernel_dim"],
    )
    key_width, value_width = k_heads * k_dim, v_heads * v_dim
    conv_channels = 2 * key_width + value_width
    # q, k, v, z projections + beta and g (a) per value head; conv; norm; output projection.
    deltanet_params = (
        hidden * (2 * key_width + 2 * value_width + 2 * v_heads)
        + conv_channels * kernel
        + 2 * v_heads
        + v_dim
        + value_width * hidden
        + hidden
    )
    recurrent = RecurrentShape(
        kind="gated_deltanet",
        layers=types.count("linear_attention"),
        state_elements=v_heads * k_dim * v_dim,
        conv_elements=(kernel - 1) * conv_channels,
        step_input_bytes=(key_width + value_width) * BF16_BYTES + 2 * v_heads * FP32_BYTES,
        params_per_layer=deltanet_params,
    )
    attention = _attention(config, types.count("full_attention"))
    expert = 3 * hidden * config["moe_intermediate_size"]
    shared = 3 * hidden * config.get("shared_expert_intermediate_size", 0)
    mlp = MlpShape(
        layers=len(types),
        dense_params_per_layer=shared + hidden * config["num_experts"] + hidden,
        experts=config["num_experts"],
        experts_per_token=config["num_experts_per_tok"],
        params_per_expert=expert,
    )
    return ModelShape(
        name=name,
        vocab_size=config["vocab_size"],
        hidden=hidden,
        max_model_len=config.get("max_position_embeddings", 4096),
        attention=attention,
        recurrent=recurrent,
        mlp=mlp,
    )
