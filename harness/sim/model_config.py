"""Read an HF-style `config.json` into the shapes the cost model needs (layers, bytes, parameters).

Only the sizes matter to the simulated engine, so this reads the fields that set them: the hybrid layer
pattern (Nemotron-H `hybrid_override_pattern`, Qwen3-Next / Qwen3.5 `layer_types` or
`full_attention_interval`), attention heads, Mamba-2 and Gated DeltaNet dimensions, and dense-MLP or MoE
sizes. A model is named by a config path, an HF model directory, or the stem of a config in `configs/models/`.
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
SHIPPED_MODELS = Path(__file__).resolve().parents[2] / "configs" / "models"


@dataclass(frozen=True)
class AttentionShape:
    """Grouped-query attention layers: they hold a KV cache that grows with the context."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    output_gate: bool = False  # q_proj also yields a sigmoid gate on the attention output (Qwen3-Next, Qwen3.5)

    @property
    def params_per_layer(self) -> int:
        q_and_o = (3 if self.output_gate else 2) * self.hidden * self.heads * self.head_dim
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
    softplus'ed dt (fp32); Gated DeltaNet the normalised key k̂ (per key head), the corrected value
    u = β(v − e^g·S·k̂) (per value head) and the log-decay g, all fp32 because they are folded into the fp32
    checkpoint (the plugin's `replayssm_patch/kernels/gdn_layout.py`). `split_entry_bytes` is what split precision
    adds to each entry: nothing for Mamba-2 (its ring already holds raw inputs); for Gated DeltaNet β (fp32) and
    the raw v (bf16) per value head, which a flush replays exactly on the fp32 master.
    """

    kind: str  # "mamba2" | "gated_deltanet"
    layers: int
    state_elements: int  # per layer per sequence
    conv_elements: int  # rolling conv window per layer per sequence (kept in bf16)
    step_input_bytes: int  # per layer per step
    params_per_layer: int
    split_entry_bytes: int = 0  # per layer per step, split precision only


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
    tied_embeddings: bool = False  # the LM head is the input embedding (Qwen3.5-4B): stored once

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
        """Input embedding (unless tied) + dense + all experts (the LM head is counted in `dense_params`)."""
        embedding = 0 if self.tied_embeddings else self.embedding_params
        return embedding + self.dense_params + self.expert_params

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


def shipped_models() -> list[str]:
    """Names `--model-config` accepts without a path: the configs shipped in `configs/models/`."""
    return sorted(path.stem for path in SHIPPED_MODELS.glob("*.json"))


def resolve_model_config(name_or_path: str | os.PathLike[str], cwd: Path | None = None) -> Path:
    """The config file a `--model-config` value means: a shipped model's name, a config.json, or an HF model dir.

    Relative paths are taken against `cwd` when given (a server's working directory). A bare word (no
    directory part, no `.json`) that is neither a shipped name nor an existing path is a one-line `UserError`.
    """
    given = Path(name_or_path)
    path = given if cwd is None or given.is_absolute() else cwd / given
    if path.is_dir():
        return path / "config.json"
    if path.exists() or given.suffix == ".json" or len(given.parts) > 1:
        return path
    shipped = SHIPPED_MODELS / f"{given.name}.json"
    if shipped.is_file():
        return shipped
    raise UserError(
        f"unknown model {str(name_or_path)!r}; choose one of {', '.join(shipped_models())} "
        "or give the path of an HF-style config.json"
    )


def load_model_shape(name_or_path: str | os.PathLike[str]) -> ModelShape:
    """Read a model's config; an unknown name or an unreadable or unsupported config is a one-line `UserError`."""
    path = resolve_model_config(name_or_path)
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(
            f"{path}: no such model config; give an HF-style config.json or one of {', '.join(shipped_models())}"
        ) from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a readable JSON model config ({exc}); fix the file") from None
    try:
        return shape_from_config(config, name=path.parent.name if path.name == "config.json" else path.stem)
    except KeyError as missing:
        raise UserError(f"{path}: model config lacks field {missing}; add it (see configs/models/)") from None


GATED_DELTANET_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")


def shape_from_config(config: dict[str, Any], name: str) -> ModelShape:
    """Dispatch on `model_type`: Nemotron-H (Mamba-2 hybrid) or Qwen3-Next / Qwen3.5 (Gated DeltaNet hybrids)."""
    model_type = config.get("model_type")
    if model_type == "nemotron_h":
        return _nemotron_h(config, name)
    if model_type in GATED_DELTANET_TYPES:
        return _gated_deltanet_hybrid(config, name)
    raise UserError(
        f"model_type {model_type!r} is not supported by the simulated engine; "
        f"use a config of model_type nemotron_h, {', '.join(GATED_DELTANET_TYPES)}"
    )


def _attention(config: dict[str, Any], layers: int, output_gate: bool = False) -> AttentionShape:
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return AttentionShape(
        layers=layers,
        heads=heads,
        kv_heads=config.get("num_key_value_heads", heads),
        head_dim=head_dim,
        hidden=config["hidden_size"],
        output_gate=output_gate,
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


def _gated_deltanet_layer_types(config: dict[str, Any]) -> list[str]:
    if config.get("layer_types"):
        return list(config["layer_types"])
    interval = config["full_attention_interval"]
    return [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(config["num_hidden_layers"])
    ]


def _gated_deltanet_mlp(config: dict[str, Any], layers: int) -> MlpShape:
    """Qwen3-Next / Qwen3.5-MoE: routed experts + a shared expert + router; Qwen3.5 dense: one SwiGLU MLP."""
    hidden = config["hidden_size"]
    if not config.get("num_experts"):
        return MlpShape(layers=layers, dense_params_per_layer=3 * hidden * config["intermediate_size"])
    shared = 3 * hidden * config.get("shared_expert_intermediate_size", 0)
    return MlpShape(
        layers=layers,
        dense_params_per_layer=shared + hidden * config["num_experts"] + hidden,
        experts=config["num_experts"],
        experts_per_token=config["num_experts_per_tok"],
        params_per_expert=3 * hidden * config["moe_intermediate_size"],
    )


def _gated_deltanet_hybrid(config: dict[str, Any], name: str) -> ModelShape:
    """Qwen3-Next (flat config) and Qwen3.5 dense / MoE (the language model's fields under `text_config`)."""
    text = config.get("text_config", config)
    hidden = text["hidden_size"]
    types = _gated_deltanet_layer_types(text)
    k_heads, v_heads = text["linear_num_key_heads"], text["linear_num_value_heads"]
    k_dim, v_dim, kernel = (
        text["linear_key_head_dim"],
        text["linear_value_head_dim"],
        text["linear_conv_kernel_dim"],
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
        step_input_bytes=(key_width + value_width + v_heads) * FP32_BYTES,  # k̂, u, g
        params_per_layer=deltanet_params,
        split_entry_bytes=v_heads * FP32_BYTES + value_width * BF16_BYTES,  # β, raw v
    )
    return ModelShape(
        name=name,
        vocab_size=text["vocab_size"],
        hidden=hidden,
        max_model_len=text.get("max_position_embeddings", 4096),
        # Qwen3-Next and Qwen3.5 attention gates its output by a second half of q_proj
        attention=_attention(text, types.count("full_attention"), output_gate=text.get("attn_output_gate", True)),
        recurrent=recurrent,
        mlp=_gated_deltanet_mlp(text, len(types)),
        tied_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
    )
