"""Layer-level equivalence inside vLLM: ReplayMambaMixer2 vs vLLM's MambaMixer2, each driven by its real
metadata builder, over prefill, decode and mixed (prefill + decode) steps on the GPU.

    export PYTHONPATH=/tmp/site:/tmp/rb-site:$PWD     # the vLLM bundle and this checkout (tools/gpu/session.sh)
    python3 -m replayssm_patch.gpu.layer_check --model MODEL_DIR --out DIR     # about a minute on an H200

Both layers get the same weights (realistic decay: A = -exp(U[0, log 16]), softplus(dt) in ~0.01..0.7),
the same paged state cache layout vLLM's GPU runner builds, and the same batches: B sequences prefill, then
decode; every few steps some finish and fresh prompts take their slots in the same step as the others'
decode (vLLM's mixed batches, where ReplaySSM runs its decode rows and vLLM's prefill path side by side).
Writes DIR/layer_check.json and .md: per step kind, the worst output relative error (max |y - y_vllm| /
max |y_vllm|) and the final checkpoint's error. The helpers here also serve the CPU checks in tests/.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

STEPS, BATCH, BUFFER_LEN, FRESH_EVERY, FRESH_ROWS = 48, 64, 16, 6, 8


def vllm_config(additional_config: dict | None, model_dir: Path, **engine_args: Any) -> Any:
    """A VllmConfig for ``model_dir`` with an fp32 SSM state (the setting ReplaySSM targets) unless
    ``engine_args`` say otherwise."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=str(model_dir), skip_tokenizer_init=True, load_format="dummy", additional_config=additional_config or {},
        **{"max_model_len": 4096, "mamba_ssm_cache_dtype": "float32", **engine_args},
    )  # fmt: skip
    return args.create_engine_config()


def make_layer(config: Any, prefix: str, device: str = "cpu", dtype: torch.dtype | None = None) -> Any:
    """A MambaMixer2 as Nemotron-H builds it (the ReplaySSM class once install_replay_mixer has run), its
    weights made on ``device`` in ``dtype`` (vLLM's loader uses the model dtype; default: torch's default)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
    from vllm.utils.torch_utils import set_default_torch_dtype

    hf = config.model_config.hf_config
    weights = set_default_torch_dtype(dtype or torch.get_default_dtype())
    with set_current_vllm_config(config), weights, torch.device(device):
        return MambaMixer2(
            hidden_size=hf.hidden_size, ssm_state_size=hf.ssm_state_size, conv_kernel_size=hf.conv_kernel,
            intermediate_size=hf.mamba_num_heads * hf.mamba_head_dim, use_conv_bias=True, use_bias=False,
            n_groups=hf.n_groups, num_heads=hf.mamba_num_heads, head_dim=hf.mamba_head_dim,
            model_config=config.model_config, cache_config=config.cache_config, prefix=prefix,
        )  # fmt: skip


def projected_width(layer: Any) -> int:
    """Columns of in_proj's output: gate, x, B, C and dt."""
    return 2 * layer.intermediate_size + 2 * layer.n_groups * layer.ssm_state_size + layer.num_heads


def paged_state_tensors(spec: Any, num_blocks: int, device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """The layer's state tensors laid out as vLLM's GPU runner does: views into one buffer of num_blocks pages,
    each block's tensors packed one after another in its page (so block strides are the page, not dense)."""
    pages = torch.zeros(num_blocks * spec.page_size_bytes, dtype=torch.uint8, device=device)
    tensors, offset = [], 0
    for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True):
        itemsize = torch.empty((), dtype=dtype).element_size()
        dense = torch.empty((num_blocks, *shape), dtype=dtype, device="meta").stride()
        assert offset % itemsize == 0, f"state tensor {shape} {dtype} starts misaligned at byte {offset}"
        stride = (spec.page_size_bytes // itemsize, *dense[1:])
        tensors.append(torch.as_strided(pages.view(dtype), (num_blocks, *shape), stride, offset // itemsize))
        offset += dense[0] * itemsize
    return tensors


def common_metadata(
    query_lens: list[int], seq_lens: list[int], blocks: list, prefilling: list[bool], device: str = "cpu"
) -> Any:
    """One step's batch as vLLM's model runner hands it to the builders: one mamba block per request, or a list of
    blocks per request (vLLM's 1 + k under speculative decoding)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    ql = torch.tensor(query_lens, dtype=torch.int32)
    qsl = torch.zeros(len(ql) + 1, dtype=torch.int32)
    qsl[1:] = ql.cumsum(0)
    sl = torch.tensor(seq_lens, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl.to(device), query_start_loc_cpu=qsl, seq_lens=sl.to(device), num_reqs=len(ql),
        num_actual_tokens=int(ql.sum()), max_query_len=int(ql.max()), max_seq_len=int(sl.max()),
        block_table_tensor=torch.tensor(blocks, dtype=torch.int32, device=device).reshape(len(ql), -1),
        slot_mapping=torch.zeros(int(ql.sum()), dtype=torch.int64, device=device),
        is_prefilling=torch.tensor(prefilling), seq_lens_cpu_upper_bound=sl.clone(),
    )  # fmt: skip


def realistic_weights(layer: Any, gen: torch.Generator) -> None:
    """Decay and step sizes in the ranges trained Mamba-2 layers use (dummy weights leave A ~ 0)."""
    heads = layer.num_heads
    with torch.no_grad():
        layer.A.copy_(-torch.exp(torch.rand(heads, generator=gen) * torch.log(torch.tensor(16.0))))
        layer.dt_bias.copy_(torch.rand(heads, generator=gen) * 5 - 5)
        layer.D.copy_(torch.randn(heads, generator=gen))
        layer.conv1d.weight.copy_(torch.randn(layer.conv1d.weight.shape, generator=gen) * 0.5)
        layer.conv1d.bias.copy_(torch.randn(layer.conv1d.bias.shape, generator=gen) * 0.1)


def select_vllm_ssu_backend(config: Any, spec: Any, layer_name: str) -> None:
    """Pick vLLM's selective_state_update backend as its model runner does once the KV cache is known."""
    from vllm.model_executor.layers.mamba.ops.ssu_dispatch import initialize_mamba_ssu_backend
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    kv_cache = KVCacheConfig(
        num_blocks=BATCH + 1, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec([layer_name], spec)]
    )
    initialize_mamba_ssu_backend(config.mamba_config, kv_cache)


class Schedule:
    """Which sequence each slot holds and how far it is: yields vLLM-ordered batches (decode rows first)."""

    def __init__(self, gen: torch.Generator) -> None:
        self.gen = gen
        self.length = {slot: 0 for slot in range(1, BATCH + 1)}  # tokens already computed per slot
        self.prompt = {slot: self._prompt_len() for slot in self.length}

    def _prompt_len(self) -> int:
        return int(torch.randint(16, 400, (1,), generator=self.gen))

    def step(self, index: int) -> tuple[list[int], list[int], list[int], list[bool]]:
        if index and index % FRESH_EVERY == 0:  # some sequences end; fresh prompts take their slots
            for slot in list(self.length)[index % BATCH : index % BATCH + FRESH_ROWS]:
                self.length[slot], self.prompt[slot] = 0, self._prompt_len()
        decode = [s for s in self.length if self.length[s] >= self.prompt[s]]
        prefill = [s for s in self.length if self.length[s] < self.prompt[s]]
        rows = decode + prefill
        query = [1] * len(decode) + [self.prompt[s] - self.length[s] for s in prefill]
        for slot, q in zip(rows, query, strict=True):
            self.length[slot] += q
        return query, [self.length[s] for s in rows], rows, [False] * len(decode) + [True] * len(prefill)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


def run(model_dir: Path, split: bool, device: str = "cuda") -> dict[str, Any]:
    """Drive a stock and a ReplaySSM layer through the same STEPS batches; errors per step kind.

    A second ReplaySSM layer stands for another KV-cache group: its metadata comes from vLLM's
    update_block_table of the first group's (other blocks, the shared ring plan), and its output must equal
    the first ReplaySSM layer's exactly.
    """
    from vllm.forward_context import set_forward_context

    gen = torch.Generator().manual_seed(0)
    base_cfg = vllm_config(None, model_dir)
    knobs = {"enable": True, "buffer_len": BUFFER_LEN, "split_precision": split}
    rep_cfg = vllm_config({"replayssm": knobs}, model_dir)
    tag = "split" if split else "fp32"
    dtype = base_cfg.model_config.dtype
    base = make_layer(base_cfg, f"base_{tag}.mixer", device, dtype)
    rep = make_layer(rep_cfg, f"rep_{tag}.mixer", device, dtype)
    other = make_layer(rep_cfg, f"other_{tag}.mixer", device, dtype)
    realistic_weights(base, gen)
    rep.load_state_dict(base.state_dict())
    other.load_state_dict(base.state_dict())
    layers = {"base": (base, base_cfg), "rep": (rep, rep_cfg), "other": (other, rep_cfg)}
    builders = {}
    for name, (layer, config) in layers.items():
        spec = layer.get_kv_cache_spec(config)
        layer.kv_cache = paged_state_tensors(spec, BATCH + 1, device)
        builders[name] = layer.get_attn_backend().get_builder_cls()(spec, [layer.prefix], config, torch.device(device))
    select_vllm_ssu_backend(base_cfg, base.get_kv_cache_spec(base_cfg), base.prefix)
    schedule = Schedule(gen)
    worst: dict[str, float] = defaultdict(float)
    for index in range(STEPS):
        query, seq_lens, rows, prefilling = schedule.step(index)
        kind = "decode" if not any(prefilling) else ("prefill" if all(prefilling) else "mixed")
        projected = torch.randn(sum(query), projected_width(base), generator=gen).to(device, dtype)
        step = {name: common_metadata(query, seq_lens, rows, prefilling, device) for name in ("base", "rep")}
        metadata = {name: builders[name].build(0, common) for name, common in step.items()}
        their_blocks = common_metadata(query, seq_lens, [BATCH + 1 - slot for slot in rows], prefilling, device)
        metadata["other"] = builders["other"].update_block_table(
            metadata["rep"], their_blocks.block_table_tensor, their_blocks.slot_mapping
        )
        outs = {}
        for name, (layer, config) in layers.items():
            outs[name] = torch.zeros(sum(query), base.intermediate_size, device=device, dtype=dtype)
            with set_forward_context({layer.prefix: metadata[name]}, config), torch.no_grad():
                layer.conv_ssm_forward(projected, outs[name])
        worst[kind] = max(worst[kind], relative_error(outs["rep"], outs["base"]))
        worst["other group vs first"] = max(worst["other group vs first"], relative_error(outs["other"], outs["rep"]))
    # every slot's checkpoint once its pending ring entries are folded in (a prefill step on all rows would)
    slots = torch.arange(1, BATCH + 1, device=device, dtype=torch.int32)
    pending = builders["rep"].cursors.take_pending(slots)
    rep.materialise(slots, pending)
    return {
        "worst_output_rel_err": dict(worst),
        "final_state_rel_err": relative_error(rep.kv_cache[1][1:], base.kv_cache[1][1:]),
    }


def write_report(out: Path, results: dict[str, Any]) -> None:
    (out / "layer_check.json").write_text(json.dumps(results, indent=1))
    lines = [
        "# ReplaySSM layer vs vLLM's MambaMixer2 (vLLM 0.24.0, real builders, paged cache)", "",
        f"{STEPS} steps, {BATCH} sequences, ring {BUFFER_LEN}; fresh prompts join every {FRESH_EVERY} steps.", "",
        "| checkpoint | prefill steps | decode steps | mixed steps | other KV-cache group vs first (expected 0) "
        "| final state |", "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for mode, got in results.items():
        w = got["worst_output_rel_err"]
        cells = [f"{w[k]:.2e}" if k in w else "-" for k in ("prefill", "decode", "mixed", "other group vs first")]
        lines.append(f"| {mode} | {' | '.join(cells)} | {got['final_state_rel_err']:.2e} |")
    (out / "layer_check.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="dir with the model's config.json")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: no CUDA GPU; this check runs vLLM's own GPU kernels (tests/ hold the CPU version)")
        return 2
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    from replayssm_patch.config import ReplaySSMConfig
    from replayssm_patch.mixer import install_replay_mixer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(vllm_config(None, args.model)):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, backend="nccl")
        ensure_model_parallel_initialized(1, 1)
    install_replay_mixer(ReplaySSMConfig(enable=True, buffer_len=BUFFER_LEN))
    torch.set_grad_enabled(False)
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"fp32": run(args.model, split=False), "split": run(args.model, split=True)}
    write_report(args.out, results)
    print((args.out / "layer_check.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
