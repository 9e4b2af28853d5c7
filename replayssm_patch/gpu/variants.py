"""The arms every GPU script compares, as vLLM ``additional_config`` values, vLLM's two compile modes, and what a
model family needs to start.

One table, so the engine-side step, the profile, the serve check and the shell stages of tools/gpu enable
the plugin with the same knobs and start a model the same way:

    python3 -m replayssm_patch.gpu.variants replayssm_fp32     # prints the --additional-config JSON ({} for baseline)
    python3 -m replayssm_patch.gpu.variants --mode O0          # the server flags of a compile mode, one a line
    python3 -m replayssm_patch.gpu.variants --family MODEL_DIR # the server flags the model's family needs, one a line
    python3 -m replayssm_patch.gpu.variants --speculative      # the --speculative-config JSON of the spec arms
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from replayssm_patch import GDN_MODEL_OVERRIDES

VARIANTS: dict[str, dict[str, Any] | None] = {
    "baseline": None,
    "replayssm_fp32": {"replayssm": {"enable": True, "buffer_len": 16, "split_precision": False}},
    "replayssm_split": {"replayssm": {"enable": True, "buffer_len": 16, "split_precision": True}},
    # steps with prefills run vLLM's own path after a fold (config.native_mixed_steps)
    "replayssm_fp32_native_mixed": {"replayssm": {"enable": True, "buffer_len": 16, "native_mixed_steps": True}},
    # GDN: every KV-cache group builds its own metadata (config.per_group_builds): the shared build's control arm
    "replayssm_fp32_per_group": {"replayssm": {"enable": True, "buffer_len": 16, "per_group_builds": True}},
    # GDN: a mixed step's decode rows through vLLM's conv update and three replay launches (config.gdn_one_launch_mixed
    # off): the one-launch kernel's control arm
    "replayssm_fp32_four_launch_mixed": {
        "replayssm": {"enable": True, "buffer_len": 16, "gdn_one_launch_mixed": False}
    },
    # a ring of 28: under MTP k = 3 its L + T = 32 entries fill the tile the kernels pad 20 to, and a row folds every
    # ~10 verifies at AL 3 instead of every ~6 (the kernel bench's verify rows "L = 28")
    "replayssm_fp32_l28": {"replayssm": {"enable": True, "buffer_len": 28, "split_precision": False}},
    "replayssm_split_l28": {"replayssm": {"enable": True, "buffer_len": 28, "split_precision": True}},
    # every Mamba KV-cache group builds its own verify plan, as before session 26 (config.per_group_builds): the
    # shared build's control arm under speculation
    "replayssm_fp32_l28_per_group": {"replayssm": {"enable": True, "buffer_len": 28, "per_group_builds": True}},
}

# The speculative-decoding benchmark's arms (gpu/spec_step.py): a variant above, with or without speculation
# (MTP with synthetic acceptance), so native and ReplaySSM speculate with the same drafter and knobs.
SPEC_ARMS: dict[str, tuple[str, bool]] = {
    "native_standard": ("baseline", False),
    "native_spec": ("baseline", True),
    "replayssm_standard": ("replayssm_fp32", False),
    "replayssm_spec": ("replayssm_fp32", True),
    # the verify reading the bf16 copy (half the checkpoint bytes, the launch's main traffic): ReplaySSM's fastest
    # speculation, for the throughput target; greedy agreement is required of the fp32 arm only
    "replayssm_split_spec": ("replayssm_split", True),
    "replayssm_spec_l28": ("replayssm_fp32_l28", True),  # fewer folds for a longer history to replay
    "replayssm_split_spec_l28": ("replayssm_split_l28", True),  # both: the fastest the kernel bench predicts
    "replayssm_spec_l28_per_group": ("replayssm_fp32_l28_per_group", True),  # one build per group: the control arm
}

# Speculation in every spec arm and server (spec_step, MODEL=mtp onegpu.sh): MTP drafts k = 3, accepted by vLLM
# 0.24's synthetic rejection sampling at mean length AL = 3.0 (random weights accept nothing otherwise).
SPEC_TOKENS, ACCEPTANCE_LENGTH = 3, 3.0


def speculative_config(tokens: int = SPEC_TOKENS, length: float = ACCEPTANCE_LENGTH) -> dict[str, Any]:
    """vLLM 0.24 SpeculativeConfig fields: MTP drafts, accepted by synthetic rejection sampling at mean length AL."""
    return {"method": "mtp", "num_speculative_tokens": tokens, "rejection_sample_method": "synthetic",
            "synthetic_acceptance_length": length}  # fmt: skip


# O0: no torch.compile, full CUDA graphs for decode only (the calibration's setting, fastest start-up).
# default: vLLM's own defaults (torch.compile, FULL_AND_PIECEWISE graphs), what production runs.
O0_COMPILATION = {"cudagraph_mode": "FULL_DECODE_ONLY"}
MODES: dict[str, dict[str, Any]] = {
    "O0": {"optimization_level": 0, "compilation_config": O0_COMPILATION},
    "default": {},
}


def server_flags(mode: str) -> list[str]:
    """`vllm serve` flags equivalent to MODES[mode] (the API server spells them -O0 and -cc JSON)."""
    return ["-O0", "-cc", json.dumps(O0_COMPILATION, separators=(",", ":"))] if mode == "O0" else []


def model_family_kwargs(model_dir: Path) -> dict[str, Any]:
    """`vllm.LLM` keywords a model family needs: Qwen3.5 checkpoints are vision-language, served text only; GDN
    models prefill with vLLM's Triton kernels (the offline bundle cannot JIT FlashInfer's GDN prefill)."""
    config = json.loads((model_dir / "config.json").read_text())
    kwargs: dict[str, Any] = {"language_model_only": True} if "vision_config" in config else {}
    if set(config.get("architectures", [])) & set(GDN_MODEL_OVERRIDES):
        kwargs["gdn_prefill_backend"] = "triton"
    return kwargs


def family_flags(model_dir: Path) -> list[str]:
    """`vllm serve` flags equivalent to model_family_kwargs(model_dir) (a True keyword is a bare switch)."""
    flags: list[str] = []
    for key, value in model_family_kwargs(model_dir).items():
        flags += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return flags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variant", nargs="?", choices=list(VARIANTS))
    parser.add_argument("--mode", choices=list(MODES))
    parser.add_argument("--family", type=Path, metavar="MODEL_DIR", help="a dir holding the model's config.json")
    parser.add_argument("--speculative", action="store_true", help="the spec arms' --speculative-config JSON")
    args = parser.parse_args(argv)
    if [args.variant, args.mode, args.family, args.speculative or None].count(None) != 3:
        parser.error("give one of: a variant, --mode MODE, --family MODEL_DIR, --speculative")
    if args.family is not None and not (args.family / "config.json").exists():
        parser.error(f"{args.family / 'config.json'} missing; give --family a model dir (session.sh setup makes them)")
    if args.variant is not None or args.speculative:
        value = speculative_config() if args.speculative else VARIANTS[args.variant] or {}
        print(json.dumps(value, separators=(",", ":")))
        return 0
    flags = server_flags(args.mode) if args.mode is not None else family_flags(args.family)
    for flag in flags:  # one a line, for bash's `mapfile -t FLAGS < <(...)`
        print(flag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
