"""A model's host floor: the same layers at toy widths, so that a decode step leaves the GPU next to idle.

Why: under vLLM's async scheduling a decode step takes max(GPU work, the engine's host work per step), and the
host work (scheduling, input preparation, metadata builders, sampling bookkeeping) grows with the batch and the
number of layers and KV-cache groups, not with the widths. At batch 256 the ReplaySSM step stopped near 19 ms
while its profile showed 16.5 ms of kernels, and stock vLLM with a bf16 state stopped at 19.4 ms. This config
keeps every layer, the layer pattern, d_state and the vocabulary, and shrinks the widths ~16x, so
`engine_step --model <floor dir>` measures that floor per batch and arm with the same clock as the real rows:

    python3 -m replayssm_patch.gpu.host_floor --model /tmp/model --out /tmp/model-floor   # then make-tokenizer.py

Nemotron-H (Mamba-2) and Qwen3.5 (Gated DeltaNet) have floor widths: replayssm.sh floor:V and gdnfloor:V.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# Nemotron-H: hidden 4096 -> 256 with Mamba-2 heads 128 -> 8 (8 groups of 1 head, head_dim 64: 8 * 64 = 2 * 256,
# the mixer's expand), attention 32 -> 2 query heads and 8 -> 1 KV head of head_dim 128, MLP 21504 -> 512.
# Qwen3.5 (its text_config): hidden 2560 -> 256, Gated DeltaNet heads 16 key / 32 value -> 2 / 4 of 128 x 128 state
# each, attention 16 -> 2 query heads and 4 -> 1 KV head of head_dim 256, MLP 9216 -> 512.
FLOOR_WIDTHS: dict[str, dict[str, int]] = {
    "nemotron_h": {
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "mamba_num_heads": 8,
        "mamba_n_groups": 8,
    },
    "qwen3_5": {
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
    },
}


class FloorConfigError(ValueError):
    """A model config this module cannot shrink; the message names the fix."""


def floor_config(config: dict[str, Any]) -> dict[str, Any]:
    """The model's config at the floor widths (layers, pattern, state and head dims and vocabulary unchanged); a
    multimodal config (Qwen3.5) has its language model's widths in text_config, and only those change."""
    widths = FLOOR_WIDTHS.get(config.get("model_type", ""))
    if widths is None:
        raise FloorConfigError(
            f"model_type {config.get('model_type')!r} has no floor widths; supported: {', '.join(FLOOR_WIDTHS)}"
        )
    nested = "text_config" in config
    floor = (config["text_config"] if nested else config) | widths
    if not widths_consistent(floor):
        raise FloorConfigError(f"floor widths inconsistent with {config.get('model_type')}: fix FLOOR_WIDTHS")
    return config | {"text_config": floor} if nested else floor


def widths_consistent(floor: dict[str, Any]) -> bool:
    """The constraints the model's layers put on the widths: Mamba-2 heads x head_dim = expand x hidden in groups;
    Gated DeltaNet value heads in whole groups per key head."""
    if "mamba_num_heads" in floor:
        heads = floor["mamba_num_heads"]
        expand = floor.get("mamba_expand", 2)
        return heads * floor["mamba_head_dim"] == expand * floor["hidden_size"] and not heads % floor["mamba_n_groups"]
    return not floor["linear_num_value_heads"] % floor["linear_num_key_heads"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="dir holding the model's config.json")
    parser.add_argument("--out", type=Path, required=True, help="dir to write the floor config.json into")
    args = parser.parse_args(argv)
    source = args.model / "config.json"
    try:
        config = floor_config(json.loads(source.read_text()))
    except (OSError, ValueError) as exc:  # FloorConfigError is a ValueError, so is bad JSON
        print(f"error: {source}: {exc}")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    print(f"wrote the host-floor config of {source} to {args.out / 'config.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
