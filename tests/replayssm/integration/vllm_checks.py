"""Checks that need the real vllm==0.24.0 Python modules, run by test_vllm_integration.py in the cached
CPU venv (tools/vllm_venv.sh). Args: Nemotron-H-8B model dir, tiny model dir, result file (one JSON
object; vLLM logs to stdout). Not collected by
pytest (no test_ prefix): the main venv has no vLLM.
"""

from __future__ import annotations

import json
import socket
import sys
from importlib.metadata import entry_points
from pathlib import Path

import torch
import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform

platforms.current_platform = CpuPlatform()  # the CUDA wheel finds no GPU here; vLLM's CPU platform builds configs
import vllm.utils.torch_utils as torch_utils  # noqa: E402

torch_utils.PIN_MEMORY = False  # no pinned-memory allocator without a GPU; set before modules import the flag

from vllm.config import set_current_vllm_config  # noqa: E402
from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2  # noqa: E402
from vllm.model_executor.models import ModelRegistry  # noqa: E402
from vllm.plugins import load_general_plugins  # noqa: E402
from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionBackend  # noqa: E402
from vllm.v1.kv_cache_interface import MambaSpec  # noqa: E402

ENABLED = {"replayssm": {"enable": True, "buffer_len": 16, "split_precision": True}}


def vllm_config(additional_config: dict | None, model_dir: Path, **engine_args):
    args = EngineArgs(
        model=str(model_dir), skip_tokenizer_init=True, load_format="dummy", mamba_ssm_cache_dtype="float32",
        additional_config=additional_config or {}, **{"max_model_len": 4096, **engine_args},
    )  # fmt: skip
    return args.create_engine_config()


def model_spec(config) -> MambaSpec:
    model_cls, _ = ModelRegistry.resolve_model_cls(config.model_config.architecture, model_config=config.model_config)
    spec = MambaSpec(
        shapes=model_cls.get_mamba_state_shape_from_config(config),
        dtypes=model_cls.get_mamba_state_dtype_from_config(config),
        block_size=-1,
    )
    return model_cls, spec


def layer_of(config) -> MambaMixer2:
    hf = config.model_config.hf_config
    with set_current_vllm_config(config):
        return MambaMixer2(
            hidden_size=hf.hidden_size, ssm_state_size=hf.ssm_state_size, conv_kernel_size=hf.conv_kernel,
            intermediate_size=hf.mamba_num_heads * hf.mamba_head_dim, use_conv_bias=True, use_bias=False,
            n_groups=hf.n_groups, num_heads=hf.mamba_num_heads, head_dim=hf.mamba_head_dim,
            model_config=config.model_config, cache_config=config.cache_config, prefix=f"layer{id(config)}",
        )  # fmt: skip


def describe(spec: MambaSpec) -> dict:
    return {"shapes": [list(s) for s in spec.shapes], "dtypes": [str(d) for d in spec.dtypes],
            "page_size_bytes": spec.page_size_bytes}  # fmt: skip


def common_metadata(query_lens: list[int], seq_lens: list[int], blocks: list[int], prefilling: list[bool]):
    """One step's batch as vLLM's model runner hands it to the builders (one mamba block per request)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    ql = torch.tensor(query_lens, dtype=torch.int32)
    qsl = torch.zeros(len(ql) + 1, dtype=torch.int32)
    qsl[1:] = ql.cumsum(0)
    sl = torch.tensor(seq_lens, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=sl, num_reqs=len(ql),
        num_actual_tokens=int(ql.sum()), max_query_len=int(ql.max()), max_seq_len=int(sl.max()),
        block_table_tensor=torch.tensor(blocks, dtype=torch.int32).unsqueeze(1),
        slot_mapping=torch.zeros(int(ql.sum()), dtype=torch.int64), is_prefilling=torch.tensor(prefilling),
        seq_lens_cpu_upper_bound=sl.clone(),
    )  # fmt: skip


def tiny_model_checks(tiny_dir: Path) -> dict:
    """Build the whole enabled model (tiny Nemotron-H) and drive its layer's real builder for a few steps."""
    config = vllm_config({"replayssm": {"enable": True, "buffer_len": 4}}, tiny_dir, max_model_len=512)
    model_cls, _ = ModelRegistry.resolve_model_cls(config.model_config.architecture, model_config=config.model_config)
    with set_current_vllm_config(config):
        torch.set_default_dtype(config.model_config.dtype)
        model = model_cls(vllm_config=config, prefix="")
        torch.set_default_dtype(torch.float32)
    mixers = [mod for mod in model.modules() if isinstance(mod, MambaMixer2)]
    layer = mixers[0]
    spec = layer.get_kv_cache_spec(config)
    shapes_dtypes = zip(spec.shapes, spec.dtypes, strict=True)
    layer.kv_cache = [torch.zeros((8, *shape), dtype=dtype) for shape, dtype in shapes_dtypes]  # 8 blocks
    builder = layer.get_attn_backend().get_builder_cls()(spec, [layer.prefix], config, torch.device("cpu"))
    steps = []
    capture = builder.build_for_cudagraph_capture(common_metadata([1, 1], [1, 1], [0, 0], [False, False]))
    allocated = builder.cursors is not None
    steps.append({"capture_write_pos": capture.replay_write_pos.tolist(), "table_allocated": allocated})
    for step in range(5):  # two decoding sequences in blocks 3 and 5
        m = builder.build(0, common_metadata([1, 1], [10 + step, 20 + step], [3, 5], [False, False]))
        steps.append({"write_pos": m.replay_write_pos.tolist(), "flush_len": m.replay_flush_len.tolist()})
    # block 3 decodes beside a fresh 7-token prompt in reused block 6 (whose stale cursor is 2)
    builder.cursors.positions[6] = 2
    m = builder.build(0, common_metadata([1, 7], [16, 7], [3, 6], [False, True]))
    steps.append({"decodes": m.num_decodes, "prefills": m.num_prefills, "pending": m.replay_pending.tolist(),
                  "after": builder.cursors.positions.tolist()})  # fmt: skip
    refused = None
    try:
        model_cls.get_mamba_state_shape_from_config(
            vllm_config({"replayssm": {"enable": True}}, tiny_dir, max_model_len=512, enable_prefix_caching=True)
        )
    except Exception as exc:
        refused = f"{type(exc).__name__}: {exc}"
    return {"mixer_classes": sorted({type(mod).__name__ for mod in mixers}), "mixers": len(mixers),
            "steps": steps, "refused_prefix_caching": refused}  # fmt: skip


def main(model_dir: Path, tiny_dir: Path, result_file: Path) -> None:
    out: dict = {}
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    out["entry_point"] = plugins.get("replayssm")
    load_general_plugins()
    from replayssm_patch import register

    register()  # second call: idempotent
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(vllm_config(None, model_dir)):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, backend="gloo")
        ensure_model_parallel_initialized(1, 1)

    for name, extra in (("disabled", None), ("enabled", ENABLED), ("disabled_after_enabled", None)):
        config = vllm_config(extra, model_dir)
        model_cls, spec = model_spec(config)
        stock = MambaSpec(
            shapes=model_cls.__mro__[2].get_mamba_state_shape_from_config(config),
            dtypes=model_cls.__mro__[2].get_mamba_state_dtype_from_config(config),
            block_size=-1,
        )
        if name == "enabled":
            from replayssm_patch.config import replayssm_config_of
            from replayssm_patch.mixer import install_replay_mixer

            install_replay_mixer(replayssm_config_of(config))  # what the model class does before building layers
        layer = layer_of(config)
        layer_spec = layer.get_kv_cache_spec(config)
        out[name] = {
            "model_class": model_cls.__name__,
            "stock_base": model_cls.__mro__[2].__name__,
            "model_spec": describe(spec),
            "stock_spec": describe(stock),
            "layer_class": type(layer).__name__,
            "layer_is_stock_class": type(layer) is MambaMixer2,
            "layer_spec": describe(layer_spec),
            "backend": layer.get_attn_backend().__name__,
            "backend_is_stock": layer.get_attn_backend() is Mamba2AttentionBackend,
            "builder": layer.get_attn_backend().get_builder_cls().__name__,
        }
    out["tiny_model"] = tiny_model_checks(tiny_dir)
    result_file.write_text(json.dumps(out))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(*map(Path, sys.argv[1:4]))
