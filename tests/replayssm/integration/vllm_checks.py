"""Checks that need the real vllm==0.24.0 Python modules, run by test_vllm_mamba2_plugin.py in the cached
CPU venv (tools/vllm_venv.sh). Args: Nemotron-H-8B model dir, tiny model dir, result file (one JSON
object; vLLM logs to stdout). Not collected by
pytest (no test_ prefix): the main venv has no vLLM.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import torch
import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform

platforms.current_platform = CpuPlatform()  # the CUDA wheel finds no GPU here; vLLM's CPU platform builds configs
# On a CPU with AMX tiles that platform turns prefix caching and chunked prefill off for every model with linear
# attention (a limit of vLLM's CPU kernels), which changes the CUDA-server configs under test from one dev machine to
# the next (on an AMX host, a config asking for prefix caching fails vLLM's own validation): the checks see no AMX.
torch.cpu._is_amx_tile_supported = lambda: False
import vllm.utils.torch_utils as torch_utils  # noqa: E402

torch_utils.PIN_MEMORY = False  # no pinned-memory allocator without a GPU; set before modules import the flag

from vllm.config import set_current_vllm_config  # noqa: E402
from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment  # noqa: E402
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2  # noqa: E402
from vllm.model_executor.models import ModelRegistry  # noqa: E402
from vllm.plugins import load_general_plugins  # noqa: E402
from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionBackend  # noqa: E402
from vllm.v1.kv_cache_interface import MambaSpec  # noqa: E402

from replayssm_patch.gpu.layer_check import common_metadata, make_layer, relative_error, vllm_config  # noqa: E402

ENABLED = {"replayssm": {"enable": True, "buffer_len": 16, "split_precision": True}}


def flush_list(m) -> list[int]:
    """The fold's work list of a built step: the rows the decode step folds."""
    return m.replay_flush_rows[: int(m.replay_flush_count.item())].tolist()


def model_spec(config) -> MambaSpec:
    model_cls, _ = ModelRegistry.resolve_model_cls(config.model_config.architecture, model_config=config.model_config)
    spec = MambaSpec(
        shapes=model_cls.get_mamba_state_shape_from_config(config),
        dtypes=model_cls.get_mamba_state_dtype_from_config(config),
        block_size=-1,
    )
    return model_cls, spec


def describe(spec: MambaSpec) -> dict:
    return {"shapes": [list(s) for s in spec.shapes], "dtypes": [str(d) for d in spec.dtypes],
            "page_size_bytes": spec.page_size_bytes}  # fmt: skip


def tiny_model_checks(tiny_dir: Path) -> dict:
    """Build the whole enabled model (tiny Nemotron-H) and drive its layer's real builder for a few steps."""
    config = vllm_config(
        {"replayssm": {"enable": True, "buffer_len": 4, "stagger_windows": False}}, tiny_dir, max_model_len=512
    )
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
    steps.append({"capture_write_pos": capture.replay_write_pos.tolist(), "table_allocated": allocated,
                  "capture_flush_list": flush_list(capture)})  # fmt: skip
    for step in range(5):  # two decoding sequences in blocks 3 and 5
        m = builder.build(0, common_metadata([1, 1], [10 + step, 20 + step], [3, 5], [False, False]))
        steps.append({"write_pos": m.replay_write_pos.tolist(), "flush_len": m.replay_flush_len.tolist(),
                      "flush_list": flush_list(m)})  # fmt: skip
        if step == 3:  # the flush step, as another KV-cache group (blocks 2 and 4) gets it from vLLM
            other = layer.get_attn_backend().get_builder_cls()(spec, [mixers[1].prefix], config, torch.device("cpu"))
            theirs = common_metadata([1, 1], [13, 23], [2, 4], [False, False])
            shared = other.update_block_table(m, theirs.block_table_tensor, theirs.slot_mapping)
            other_group = {
                "slots": shared.state_indices_tensor_d[:, 0].tolist(), "write_pos": shared.replay_write_pos.tolist(),
                "flush_len": shared.replay_flush_len.tolist(),
                "shared_buffers": shared.replay_write_pos.data_ptr() == other.plan_buffers.write_pos.data_ptr()
                == builder.plan_buffers.write_pos.data_ptr(),
                "cursor_table": other.cursors is not None,
            }  # fmt: skip
    # block 3 decodes beside a fresh 7-token prompt in reused block 6 (whose stale cursor is 2)
    builder.cursors.positions[6] = 2
    m = builder.build(0, common_metadata([1, 7], [16, 7], [3, 6], [False, True]))
    steps.append({"decodes": m.num_decodes, "prefills": m.num_prefills, "write_pos": m.replay_write_pos.tolist(),
                  "flush_len": m.replay_flush_len.tolist(), "pending": m.replay_pending.tolist(),
                  "fold_pending": m.replay_fold_pending,
                  "after": builder.cursors.positions.tolist()})  # fmt: skip
    refused = None
    try:
        model_cls.get_mamba_state_shape_from_config(
            vllm_config({"replayssm": {"enable": True}}, tiny_dir, max_model_len=512, enable_prefix_caching=True)
        )
    except Exception as exc:
        refused = f"{type(exc).__name__}: {exc}"
    return {"mixer_classes": sorted({type(mod).__name__ for mod in mixers}), "mixers": len(mixers),
            "steps": steps, "other_group": other_group, "refused_prefix_caching": refused}  # fmt: skip


@contextlib.contextmanager
def launch_table(path: Path, entries: dict) -> Iterator[None]:
    """The plugin's launch table is ``entries`` inside the block (builders read their limits when built, kernels
    their launch shapes when launched)."""
    from replayssm_patch.kernels import launch_config

    readers = (
        launch_config.native_max_batch, launch_config.gdn_native_max_batch, launch_config.launch_for,
        launch_config.verify_launch_for, launch_config.fold_launch_for, launch_config.gdn_launch_for,
    )  # fmt: skip
    path.write_text(json.dumps(entries))
    os.environ[launch_config.ENV_VAR] = str(path)
    try:
        for reader in readers:
            reader.cache_clear()
        yield
    finally:
        del os.environ[launch_config.ENV_VAR]
        for reader in readers:
            reader.cache_clear()


# The native-regime scenario both layer families run under a launch table whose native limit is 2 rows: the
# slots decoding at each step. Three replay steps; native from a transition that leaves slot 3 out; replay again
# (slot 3 resumes its ring); native with slot 3 alone (slots 1 and 2 left out, holding entries); replay.
NATIVE_LIMIT, NATIVE_SLOTS = 2, (1, 2, 3)
NATIVE_SCHEDULE = [[1, 2, 3]] * 3 + [[1, 2]] * 3 + [[1, 2, 3]] * 3 + [[3]] * 2 + [[1, 2, 3]]


def decode_rows(slots: list[int], seq_lens: list[int], blocks: list[int] | None = None):
    """A decode-only step of one token per slot (in ``blocks``, by default the slots themselves)."""
    return common_metadata([1] * len(slots), seq_lens, blocks or slots, [False] * len(slots))


def built_by(builder):
    """An arm's build for ``drive_native_schedule`` when its own builder builds the step."""
    return lambda slots, seq_lens, _first: builder.build(0, decode_rows(slots, seq_lens))


def drive_native_schedule(arms: dict[str, tuple], forward, step_inputs, cursors) -> dict:
    """Run ``NATIVE_SCHEDULE`` through every arm: ``arms`` maps "base" (vLLM's layer), "rep" (ReplaySSM's), "twin"
    (another ReplaySSM layer that must answer exactly as "rep") and "witness" (vLLM's layer, given "rep"'s state
    before each native step, which "rep" must equal bit for bit) to (layer, config, build); build(slots, seq_lens,
    rep's metadata) gives the arm's metadata, built in that order as vLLM builds groups. ``forward(layer, config,
    metadata, inputs)`` runs a layer on ``step_inputs(rows)``; ``cursors()`` is "rep"'s cursor table."""
    rep, witness = arms["rep"][0], arms["witness"][0]
    lengths = {slot: 20 + 10 * slot for slot in NATIVE_SLOTS}
    steps = []
    for slots in NATIVE_SCHEDULE:
        lengths.update({slot: lengths[slot] + 1 for slot in slots})
        seq_lens = [lengths[slot] for slot in slots]
        metadata: dict = {}
        for name in ("base", "rep", "twin"):
            metadata[name] = arms[name][2](slots, seq_lens, metadata.get("rep"))
        native, transition = metadata["rep"].replay_native, metadata["rep"].replay_transition_pending
        if native:  # the state vLLM's path reads, once the builder has folded the transition
            for index in (0, 1):
                witness.kv_cache[index].copy_(rep.kv_cache[index])
            metadata["witness"] = arms["witness"][2](slots, seq_lens, None)
        rings = [tensor.clone() for tensor in rep.kv_cache[2:]]
        inputs = step_inputs(len(slots))
        outs = {name: forward(arms[name][0], arms[name][1], md, inputs) for name, md in metadata.items()}
        untouched = all(torch.equal(before, after) for before, after in zip(rings, rep.kv_cache[2:], strict=True))
        step = {"native": native, "transition": None if transition is None else transition.tolist(),
                "cursors": cursors().positions[list(NATIVE_SLOTS)].tolist(), "rings_untouched": untouched,
                "rel_err": relative_error(outs["rep"], outs["base"]),
                "twin_equal": torch.equal(outs["twin"], outs["rep"])}  # fmt: skip
        if native:
            step["equals_vllm_bit_for_bit"] = torch.equal(outs["rep"], outs["witness"]) and all(
                torch.equal(rep.kv_cache[index], witness.kv_cache[index]) for index in (0, 1)
            )
        steps.append(step)
    return {"steps": steps}


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
        layer = make_layer(config, f"layer{id(config)}")
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
