"""Layer-level equivalence inside vLLM for Gated DeltaNet: ReplayGatedDeltaNet vs vLLM's own
QwenGatedDeltaNetAttention, each driven by its real metadata builder, over many decode steps.

    export PYTHONPATH=/tmp/site:/tmp/rb-site:$PWD     # the vLLM bundle and this checkout (tools/gpu/session.sh)
    python3 -m replayssm_patch.gpu.gdn_layer_check --model MODEL_DIR --out DIR    # 2,000 steps at batch 256
    python3 -m replayssm_patch.gpu.gdn_layer_check --model MODEL_DIR --out DIR --smoke   # CPU: a few steps

Both layers get the same weights with realistic gates (log-decay g in about [-0.1, -1e-3] and β in about
(0.05, 0.95), not the dummy init's g ≈ -0.69 that hides checkpoint errors), the paged state cache vLLM's
GPU runner lays out, and the same start state and inputs. vLLM's layer takes its default pure-decode path
(causal-conv update, then the packed recurrent decode kernel, which rewrites every state each step);
ReplaySSM's replays from checkpoint + ring and folds every ``buffer_len`` steps, once with the fp32 checkpoint
and once in split precision (the replay reads a bf16 copy; folds replay the window exactly on the fp32 master).
Writes DIR/gdn_layer_check.json and .md: per variant the worst output relative error (max |o - o_vllm| /
max |o_vllm|) over the steps and the checkpoint error after the final fold. ``--smoke`` runs the same code on
the CPU with Triton's interpreter (TRITON_INTERPRET=1, CUDA_VISIBLE_DEVICES="", vLLM's CPU venv), as the CI test does.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

from replayssm_patch.gpu.layer_check import common_metadata, paged_state_tensors, relative_error, vllm_config

FULL = {"steps": 2000, "batch": 256, "buffer_len": 16, "dtype": "auto"}
# fp32 activations on the CPU: vLLM's causal-conv update returns NaN for bf16 under Triton's interpreter.
SMOKE = {"steps": 9, "batch": 3, "buffer_len": 4, "dtype": "float32"}


def make_gdn_layer(config: Any, prefix: str, device: str = "cpu") -> Any:
    """A GDN layer as the model builds it (ReplaySSM's once install_replay_gdn has run), weights on ``device``
    in the model dtype. ``prefix`` must name a layer index (vLLM reads it), e.g. ``base.layers.0.linear_attn``."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
    from vllm.utils.torch_utils import set_default_torch_dtype

    hf = config.model_config.hf_text_config
    interleaved = config.model_config.architecture == "Qwen3NextForCausalLM"
    with set_current_vllm_config(config), set_default_torch_dtype(config.model_config.dtype), torch.device(device):
        return QwenGatedDeltaNetAttention(hf, config, prefix=prefix, gqa_interleaved_layout=interleaved)


def realistic_gates(layer: Any, gen: torch.Generator) -> None:
    """A_log and dt_bias with g = -e^A_log softplus(a + dt_bias) in about [-0.1, -1e-3] for a ~ N(0, 0.3)."""
    heads = layer.A_log.shape[0]
    with torch.no_grad():
        layer.A_log.copy_(torch.empty(heads).uniform_(-5.0, -3.0, generator=gen))
        layer.dt_bias.copy_(torch.empty(heads).uniform_(-1.0, 1.0, generator=gen))
        weight = layer.conv1d.weight
        weight.copy_(torch.randn(weight.shape, generator=gen) * 0.5)


def core_inputs(layer: Any, tokens: int, gen: torch.Generator, device: str) -> tuple[torch.Tensor, ...]:
    """mixed_qkv [T, conv_dim], b and a [T, HV] in the model dtype, as the projections hand them to the core op."""
    dtype = layer.conv1d.weight.dtype
    heads = layer.num_v_heads // layer.tp_size
    mixed = torch.randn(tokens, layer.conv_dim // layer.tp_size, generator=gen)
    b = torch.randn(tokens, heads, generator=gen) * 1.5  # β = σ(b) mostly in (0.05, 0.95)
    a = torch.randn(tokens, heads, generator=gen) * 0.3
    return tuple(t.to(device, dtype) for t in (mixed, b, a))


VARIANTS = ("fp32", "split")  # ReplaySSM's checkpoints, each against the one baseline layer


def run(model_dir: Path, steps: int, batch: int, buffer_len: int, dtype: str, device: str) -> dict[str, Any]:
    """Drive vLLM's layer and ReplaySSM's, with each checkpoint (``VARIANTS``), through ``steps`` decode steps of
    ``batch`` sequences on the same inputs; the figures per ReplaySSM variant."""
    from vllm.forward_context import set_forward_context

    from replayssm_patch.gdn_state_layout import STATE_BF16

    gen = torch.Generator().manual_seed(0)
    engine = {"max_num_seqs": max(batch, 8), "dtype": dtype}
    configs = {"base": vllm_config(None, model_dir, **engine)}
    for name in VARIANTS:
        knobs = {"enable": True, "buffer_len": buffer_len, "split_precision": name == "split"}
        configs[name] = vllm_config({"replayssm": knobs}, model_dir, **engine)
    layers = {name: make_gdn_layer(config, f"{name}.layers.0.linear_attn", device) for name, config in configs.items()}
    base = layers["base"]
    realistic_gates(base, gen)
    builders = {}
    for name, layer in layers.items():
        if layer is not base:
            with torch.no_grad():
                layer.load_state_dict(base.state_dict())
        spec = layer.get_kv_cache_spec(configs[name])
        layer.kv_cache = paged_state_tensors(spec, batch + 1, device)
        builders[name] = layer.get_attn_backend().get_builder_cls()(spec, [layer.prefix], configs[name],
                                                                     torch.device(device))  # fmt: skip
    conv0 = torch.randn(base.kv_cache[0].shape, generator=gen).to(device, base.kv_cache[0].dtype)
    ssm0 = (torch.randn(base.kv_cache[1].shape, generator=gen) * 0.1).to(device)
    for layer in layers.values():
        layer.kv_cache[0].copy_(conv0)
        layer.kv_cache[1].copy_(ssm0)
    layers["split"].kv_cache[STATE_BF16].copy_(ssm0)  # as a prefill leaves it: the copy of the checkpoint
    slots = list(range(1, batch + 1))
    heads, head_v_dim = base.num_v_heads // base.tp_size, base.head_v_dim
    errors: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for step in range(steps):
        mixed, b, a = core_inputs(base, batch, gen, device)
        outs = {}
        for name, layer in layers.items():
            common = common_metadata([1] * batch, [100 + step] * batch, slots, [False] * batch, device)
            metadata = builders[name].build(0, common)
            outs[name] = torch.zeros(batch, heads, head_v_dim, device=device, dtype=mixed.dtype)
            with set_forward_context({layer.prefix: metadata}, configs[name]), torch.no_grad():
                layer._forward_core(mixed.clone(), b, a, outs[name])
        for name in VARIANTS:
            errors[name].append(relative_error(outs[name], outs["base"]))
    index = torch.tensor(slots, device=device, dtype=torch.int32)
    results = {}
    for name in VARIANTS:
        rep = layers[name]
        pending = builders[name].cursors.take_pending(index)  # what a prefill of every row would fold first
        rep.materialise(index, pending)
        results[name] = {
            "variant": name, "steps": steps, "batch": batch, "buffer_len": buffer_len,
            "dtype": str(configs["base"].model_config.dtype), "output_rel_err": errors[name],
            "worst_output_rel_err": max(errors[name]), "pending_before_fold": pending.tolist()[:4],
            "final_state_rel_err": relative_error(rep.kv_cache[1][1:], base.kv_cache[1][1:]),
            "conv_state_equal": bool(torch.equal(rep.kv_cache[0][1:], base.kv_cache[0][1:])),
        }  # fmt: skip
    return results


def write_report(out: Path, results: dict[str, dict[str, Any]]) -> None:
    (out / "gdn_layer_check.json").write_text(json.dumps(results, indent=1))
    first = results["fp32"]
    lines = [
        "# ReplaySSM GDN layer vs vLLM's QwenGatedDeltaNetAttention (vLLM 0.24.0, real builders, paged cache)", "",
        f"{first['steps']} decode steps, {first['batch']} sequences, ring {first['buffer_len']}, fp32 state, "
        f"{first['dtype']} activations.", "",
        "| checkpoint | worst output rel. error | checkpoint rel. error after the final fold | conv states equal |",
        "|---|---|---|---|",
        *(f"| {name} | {r['worst_output_rel_err']:.2e} | {r['final_state_rel_err']:.2e} | {r['conv_state_equal']} |"
          for name, r in results.items()),
    ]  # fmt: skip
    (out / "gdn_layer_check.md").write_text("\n".join(lines) + "\n")


@triton.jit
def interpretable_exp(x):
    """tl.exp as a jitted function: vLLM's fla ops bind ``exp = tl.exp`` at import time, a name Triton's
    interpreter cannot patch ("Did you forget to add @triton.jit?")."""
    return tl.exp(x)


def prepare_cpu() -> None:
    """What running vLLM's layer code on the CPU needs (the CUDA wheel finds no GPU): vLLM's CPU platform, no
    pinned memory, and vLLM's fla ``exp`` rebound to ``interpretable_exp``."""
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms.current_platform = CpuPlatform()
    import vllm.utils.torch_utils as torch_utils

    torch_utils.PIN_MEMORY = False
    torch.accelerator.empty_cache = lambda: None  # the prefill warm-up frees GPU cache; there is none here
    import vllm.model_executor.layers.fla.ops.fused_recurrent as fused_recurrent

    fused_recurrent.exp = interpretable_exp


def init_single_rank(model_dir: Path, backend: str, **engine: Any) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(vllm_config(None, model_dir, **engine)):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, backend=backend)
        ensure_model_parallel_initialized(1, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="dir with a Qwen3.5 / Qwen3-Next config.json")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="a few steps on the CPU under Triton's interpreter")
    args = parser.parse_args(argv)
    if args.smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            print('error: --smoke runs Triton in its interpreter; set TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES=""')
            return 2
        prepare_cpu()
    elif not torch.cuda.is_available():
        print("error: no CUDA GPU; this check runs vLLM's own GPU kernels (add --smoke for the CPU version)")
        return 2
    from replayssm_patch.config import ReplaySSMConfig
    from replayssm_patch.gdn_mixer import install_replay_gdn

    sizes = SMOKE if args.smoke else FULL
    init_single_rank(args.model, "gloo" if args.smoke else "nccl")
    install_replay_gdn(ReplaySSMConfig(enable=True, buffer_len=sizes["buffer_len"]))
    torch.set_grad_enabled(False)
    args.out.mkdir(parents=True, exist_ok=True)
    write_report(args.out, run(args.model, device="cpu" if args.smoke else "cuda", **sizes))
    print((args.out / "gdn_layer_check.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
