"""Checks that need the real vllm==0.24.0 Python modules, run by test_vllm_integration.py in the cached
CPU venv (tools/vllm_venv.sh). Writes one JSON object to argv[2] (vLLM logs to stdout). Not collected by
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

from vllm.config import set_current_vllm_config  # noqa: E402
from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2  # noqa: E402
from vllm.model_executor.models import ModelRegistry  # noqa: E402
from vllm.plugins import load_general_plugins  # noqa: E402
from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionBackend  # noqa: E402
from vllm.v1.kv_cache_interface import MambaSpec  # noqa: E402

MODEL_DIR, RESULT_FILE = Path(sys.argv[1]), Path(sys.argv[2])
ENABLED = {"replayssm": {"enable": True, "buffer_len": 16, "split_precision": True}}


def vllm_config(additional_config: dict | None):
    args = EngineArgs(
        model=str(MODEL_DIR), skip_tokenizer_init=True, load_format="dummy", max_model_len=4096,
        mamba_ssm_cache_dtype="float32", additional_config=additional_config or {},
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


def metadata(num_decodes: int, slots_d: list[int], slots_p: list[int], has_state_p: list[bool]):
    from replayssm_patch.backend import ReplayMamba2AttentionMetadata

    i32 = torch.int32
    return ReplayMamba2AttentionMetadata(
        num_prefills=len(slots_p), num_prefill_tokens=8 * len(slots_p), num_decodes=num_decodes,
        num_decode_tokens=num_decodes, num_reqs=len(slots_d) + len(slots_p),
        has_initial_states_p=torch.tensor(has_state_p) if slots_p else None, query_start_loc_p=None,
        num_computed_tokens_p=None, state_indices_tensor_p=torch.tensor(slots_p, dtype=i32) if slots_p else None,
        state_indices_tensor_d=torch.tensor(slots_d, dtype=i32).unsqueeze(1) if slots_d else None,
        query_start_loc_d=None, num_accepted_tokens=None, block_idx_last_scheduled_token=None,
        block_idx_first_scheduled_token_p=None, block_idx_last_computed_token=None,
        block_idx_last_scheduled_token_prev_step=None, seq_lens=torch.zeros(1),
    )  # fmt: skip


def ring_plan_checks() -> dict:
    """The builder's per-step plan on real vLLM metadata objects: capture, decode (padded), prefill."""
    from replayssm_patch.backend import plan_ring
    from replayssm_patch.cursors import CursorTable

    table = CursorTable(num_blocks=16, buffer_len=4, device="cpu")
    write_pos = torch.full((8,), -1, dtype=torch.int32)
    flush_len = torch.full((8,), -1, dtype=torch.int32)
    steps = []
    # graph capture: 4 dummy rows on the null block, must not move anything
    plan_ring(metadata(4, [0, 0, 0, 0], [], []), lambda: table, write_pos, flush_len, dry_run=True)
    steps.append({"after_capture": table.positions.tolist(), "write_pos": write_pos[:4].tolist()})
    # real decode steps: 2 real rows (slots 5, 9) padded to 4 rows with the null block
    for _ in range(4):
        m = plan_ring(metadata(2, [5, 9, 0, 0], [], []), lambda: table, write_pos, flush_len, dry_run=False)
        steps.append({"write_pos": m.replay_write_pos.tolist(), "flush_len": m.replay_flush_len.tolist()})
    plan_ring(metadata(1, [5, 0], [], []), lambda: table, write_pos, flush_len, dry_run=False)
    # a mixed step: decode row slot 5 (1 pending), continuing prefill slot 9 (0 pending after its flush),
    # fresh prefill in reused slot 11 whose stale cursor is 3
    table.positions[11] = 3
    m = plan_ring(metadata(1, [5], [9, 11], [True, False]), lambda: table, write_pos, flush_len, dry_run=False)
    steps.append({"pending": m.replay_pending.tolist(), "after_prefill": table.positions.tolist()})
    return {"steps": steps}


def main() -> None:
    out: dict = {}
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    out["entry_point"] = plugins.get("replayssm")
    load_general_plugins()
    from replayssm_patch import register

    register()  # second call: idempotent
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(vllm_config(None)):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, backend="gloo")
        ensure_model_parallel_initialized(1, 1)

    for name, extra in (("disabled", None), ("enabled", ENABLED), ("disabled_after_enabled", None)):
        config = vllm_config(extra)
        model_cls, spec = model_spec(config)
        stock = MambaSpec(
            shapes=model_cls.__mro__[2].get_mamba_state_shape_from_config(config),
            dtypes=model_cls.__mro__[2].get_mamba_state_dtype_from_config(config),
            block_size=-1,
        )
        if name == "enabled":
            from replayssm_patch.mixer import install_replay_mixer

            install_replay_mixer()  # what the model class does before building its layers
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
    out["ring_plan"] = ring_plan_checks()
    RESULT_FILE.write_text(json.dumps(out))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
