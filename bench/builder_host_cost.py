"""Host time of a step's GDN metadata, vLLM's builder against ReplaySSM's, run inside the vLLM 0.24 CPU venv by
bench_builder.py. Args: a dir with the model's config.json, the JSON file to write.

Why: steps that prefill beside decodes run eagerly on the H200, and there ReplaySSM's Qwen3.5-4B steps spent ~10 ms
more host time than vLLM's (BENCHMARKS-sessions.md, "Churn on one host"). The metadata of every GDN KV-cache group is
made on every step, outside any CUDA graph; this times it alone, as vLLM's model runner makes it (the first group's
build, then ``update_block_table`` for the others where the builder offers it, else a build each), with the real
builders over a paged cache of the model's shapes. On the CPU the plugin's cursor plans run their PyTorch twins (one
Triton launch each on a GPU), so the figures are this machine's, for comparing the two builders, not the H200's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from replayssm_patch.gpu.gdn_layer_check import init_single_rank, make_gdn_layer, prepare_cpu

prepare_cpu()
from vllm.config import set_current_vllm_config  # noqa: E402
from vllm.plugins import load_general_plugins  # noqa: E402

from bench.builder_timing import Step, sharing, time_steps  # noqa: E402
from replayssm_patch.config import replayssm_config_of  # noqa: E402
from replayssm_patch.gdn_mixer import install_replay_gdn  # noqa: E402
from replayssm_patch.gpu.layer_check import common_metadata, paged_state_tensors, vllm_config  # noqa: E402

BATCH = 64  # decode rows, as in the churn rows
PROMPT = 1024  # the prefill beside them in a mixed step
STEPS = 300  # every third one mixed, as under churn at 64 rows and 192-token outputs
ROUNDS = 5
GROUPS = 3  # Qwen3.5-4B's GDN KV-cache groups: 24 GDN layers, 8 per group
ARMS = {"vLLM GDN builder": None, "ReplaySSM fp32": {"replayssm": {"enable": True, "buffer_len": 16}}}


def step_metadata(mixed: bool) -> Step:
    """BATCH decode rows in blocks 1..BATCH; a mixed step adds a fresh PROMPT-token prefill in the next block."""
    query = [1] * BATCH + [PROMPT] * mixed
    seq = [500 + i for i in range(BATCH)] + [PROMPT] * mixed
    blocks = list(range(1, BATCH + 1)) + [BATCH + 1] * mixed
    return Step("mixed" if mixed else "decode", common_metadata(query, seq, blocks, [False] * BATCH + [True] * mixed))


def main(model: Path, out: Path) -> None:
    load_general_plugins()
    init_single_rank(model, "gloo")
    rows = []
    for arm, knobs in ARMS.items():
        config = vllm_config(knobs, model, max_model_len=2048)
        if knobs:
            install_replay_gdn(replayssm_config_of(config))
        builders = []
        for group in range(GROUPS):  # one layer per group stands for its 8: the builder's work is per group
            layer = make_gdn_layer(config, f"{arm.split()[0].lower()}.layers.{group}.linear_attn")
            spec = layer.get_kv_cache_spec(config)
            layer.kv_cache = paged_state_tensors(spec, BATCH + 2)
            config.compilation_config.static_forward_context[layer.prefix] = layer  # where a builder finds its layers
            with set_current_vllm_config(config):
                cls = layer.get_attn_backend().get_builder_cls()
                builders.append(cls(spec, [layer.prefix], config, torch.device("cpu")))
        with set_current_vllm_config(config):
            timed = time_steps(builders, [step_metadata(k % 3 == 0) for k in range(STEPS)], ROUNDS)
        rows.append({"builder": arm, **sharing(builders), "decode step µs": timed["decode"],
                     "mixed step µs": timed["mixed"]})  # fmt: skip
    out.write_text(json.dumps(rows))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
