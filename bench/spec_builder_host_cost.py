"""Host time of a speculative step's Mamba-2 metadata, vLLM's builder against ReplaySSM's (shared plan, and a build
per group), run inside the vLLM 0.24 CPU venv by bench_spec_builder.py. Args: a dir with a Nemotron-H config.json,
the JSON file to write.

Every group gets one layer and its real builder over a paged cache (vLLM's 1 + k blocks per request, ReplaySSM's
one); each step's metadata is made for all groups as vLLM's model runner makes it (``builder_timing``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from replayssm_patch.gpu.gdn_layer_check import init_single_rank, prepare_cpu

prepare_cpu()
from vllm.config import set_current_vllm_config  # noqa: E402
from vllm.plugins import load_general_plugins  # noqa: E402

from bench.builder_timing import Step, sharing, time_steps  # noqa: E402
from replayssm_patch.config import replayssm_config_of  # noqa: E402
from replayssm_patch.gpu.layer_check import common_metadata, make_layer, paged_state_tensors, vllm_config  # noqa: E402
from replayssm_patch.mixer import install_replay_mixer  # noqa: E402

ROWS = 64  # decode rows, each a verify of T tokens
K = 3
T = 1 + K
STEPS = 200
ROUNDS = 5
GROUPS = 6  # Nemotron-H-8B's Mamba KV-cache groups
MAX_LEN = 512  # the tiny config's max_position_embeddings
SPEC = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
ARMS = {
    "vLLM Mamba-2 builder": None,
    "ReplaySSM fp32, first group's plan shared": {"replayssm": {"enable": True, "buffer_len": 28}},
    "ReplaySSM fp32, a build per group": {"replayssm": {"enable": True, "buffer_len": 28, "per_group_builds": True}},
}


def verify_steps(blocks_per_request: int, gen: torch.Generator) -> list[Step]:
    """STEPS verify steps of ROWS requests (request r in blocks 1 + r·n .. r·n + n), num_accepted random."""
    blocks = [[1 + r * blocks_per_request + j for j in range(blocks_per_request)] for r in range(ROWS)]
    steps = []
    for k in range(STEPS):
        seq_lens = [200 + r + T * (k % 50) for r in range(ROWS)]  # within the tiny model's 512 positions
        metadata = common_metadata([T] * ROWS, seq_lens, blocks, [False] * ROWS)
        accepted = torch.randint(1, T + 1, (ROWS,), generator=gen, dtype=torch.int32)
        steps.append(Step("verify", metadata, {"num_accepted_tokens": accepted}))
    return steps


def main(model: Path, out: Path) -> None:
    load_general_plugins()
    init_single_rank(model, "gloo", max_model_len=MAX_LEN)
    rows = []
    for arm, knobs in ARMS.items():
        config = vllm_config(knobs, model, max_model_len=MAX_LEN, speculative_config=SPEC, dtype="float32",
                             max_num_seqs=ROWS)  # fmt: skip
        if knobs:
            install_replay_mixer(replayssm_config_of(config))
        builders, blocks_per_request = [], 1 if knobs else T
        for group in range(GROUPS):  # one layer per group stands for its layers: the builder's work is per group
            layer = make_layer(config, f"{'rep' if knobs else 'base'}{len(rows)}.layers.{group}.mixer")
            spec = layer.get_kv_cache_spec(config)
            layer.kv_cache = paged_state_tensors(spec, 1 + ROWS * blocks_per_request)
            config.compilation_config.static_forward_context[layer.prefix] = layer  # where a builder finds its layers
            with set_current_vllm_config(config):
                cls = layer.get_attn_backend().get_builder_cls()
                builders.append(cls(spec, [layer.prefix], config, torch.device("cpu")))
        with set_current_vllm_config(config):
            timed = time_steps(builders, verify_steps(blocks_per_request, torch.Generator().manual_seed(0)), ROUNDS)
        rows.append({"builder": arm, **sharing(builders), "verify step µs": timed["verify"]})
    out.write_text(json.dumps(rows))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
