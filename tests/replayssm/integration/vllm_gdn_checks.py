"""Gated DeltaNet checks that need the real vllm==0.24.0 Python modules, run by test_vllm_gdn_plugin.py in the
cached CPU venv. Args: Qwen3.5-4B model dir, tiny Qwen3.5 model dir, result file (one JSON object).

The plugin refuses non-CUDA platforms at start-up (only vLLM's CUDA forward of the layer is wrapped), so the
model classmethods are evaluated under ``reporting_cuda``: vLLM's CPU platform answering is_cuda() with True
for the duration of that call only; layers are still built for the CPU platform.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from pathlib import Path

import torch

from replayssm_patch.gpu.gdn_layer_check import init_single_rank, make_gdn_layer, prepare_cpu

prepare_cpu()
import json  # noqa: E402

import vllm.platforms as platforms  # noqa: E402
from vllm.forward_context import get_forward_context, set_forward_context  # noqa: E402
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention  # noqa: E402
from vllm.model_executor.models import ModelRegistry  # noqa: E402
from vllm.platforms.cpu import CpuPlatform  # noqa: E402
from vllm.plugins import load_general_plugins  # noqa: E402
from vllm.v1.attention.backends.gdn_attn import GDNAttentionBackend  # noqa: E402
from vllm_checks import (  # noqa: E402
    NATIVE_LIMIT,
    NATIVE_SLOTS,
    built_by,
    decode_rows,
    describe,
    drive_native_schedule,
    flush_list,
    launch_table,
)

from replayssm_patch.config import replayssm_config_of  # noqa: E402
from replayssm_patch.gdn_mixer import install_replay_gdn  # noqa: E402
from replayssm_patch.gdn_state_layout import RING_K, RING_U, STATE_BF16  # noqa: E402
from replayssm_patch.gpu.gdn_layer_check import core_inputs, realistic_gates  # noqa: E402
from replayssm_patch.gpu.layer_check import common_metadata, paged_state_tensors, relative_error, vllm_config  # noqa: E402

ENABLED = {"replayssm": {"enable": True, "buffer_len": 16}}
ENABLED_SPLIT = {"replayssm": {"enable": True, "buffer_len": 16, "split_precision": True}}
# L = 4 with every window aligned to the prefill, so the checks can name exact cursors
ALIGNED_L4 = {"replayssm": {"enable": True, "buffer_len": 4, "stagger_windows": False}}
OTHER_GROUP_OFFSET = 4  # a second KV-cache group holds each request at block slot + 4


class CudaReportingCpuPlatform(CpuPlatform):
    def is_cuda(self) -> bool:
        return True


@contextlib.contextmanager
def reporting_cuda():
    cpu = platforms.current_platform
    platforms.current_platform = CudaReportingCpuPlatform()
    try:
        yield
    finally:
        platforms.current_platform = cpu


def model_spec(config):
    from vllm.v1.kv_cache_interface import MambaSpec

    model_cls, _ = ModelRegistry.resolve_model_cls(config.model_config.architecture, model_config=config.model_config)
    with reporting_cuda():
        spec = MambaSpec(
            shapes=model_cls.get_mamba_state_shape_from_config(config),
            dtypes=model_cls.get_mamba_state_dtype_from_config(config),
            block_size=-1,
        )
        stock = MambaSpec(
            shapes=model_cls.__mro__[2].get_mamba_state_shape_from_config(config),
            dtypes=model_cls.__mro__[2].get_mamba_state_dtype_from_config(config),
            block_size=-1,
        )
    return model_cls, spec, stock


def refusal(model_dir: Path, knobs: dict, cuda: bool = True, **engine) -> str | None:
    config = vllm_config({"replayssm": {"enable": True, **knobs}}, model_dir, **engine)
    model_cls, _ = ModelRegistry.resolve_model_cls(config.model_config.architecture, model_config=config.model_config)
    try:
        with reporting_cuda() if cuda else contextlib.nullcontext():
            model_cls.get_mamba_state_shape_from_config(config)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def layer_and_builder(config, prefix: str, blocks: int = 8) -> tuple:
    """A GDN layer (``prefix`` names its index) over a paged cache of ``blocks`` blocks, and its real builder."""
    layer = make_gdn_layer(config, prefix)
    spec = layer.get_kv_cache_spec(config)
    layer.kv_cache = paged_state_tensors(spec, blocks)
    return layer, layer.get_attn_backend().get_builder_cls()(spec, [layer.prefix], config, torch.device("cpu"))


def builder_steps(tiny: Path) -> dict:
    """The real builder (through vLLM's own build()) over capture, decode, a mixed step and a fresh 1-token row."""
    config = vllm_config(ALIGNED_L4, tiny, max_model_len=512, dtype="float32")
    layer, builder = layer_and_builder(config, "plan.layers.0.linear_attn")
    steps: list[dict] = []
    layer.kv_cache[1].normal_()  # a start-up warm-up that wrote any state would show
    before = [tensor.clone() for tensor in layer.kv_cache]
    capture = builder.build_for_cudagraph_capture(common_metadata([1, 1], [1, 1], [0, 0], [False, False]))
    steps.append({
        "capture_write_pos": capture.replay_write_pos.tolist(), "table_allocated": builder.cursors is not None,
        "capture_flush_list": flush_list(capture), "eager_kernels_warmed": builder.eager_kernels_warmed,
        "cache_unchanged": all(torch.equal(a, b) for a, b in zip(before, layer.kv_cache, strict=True)),
    })  # fmt: skip
    layer.kv_cache[1].zero_()
    for step in range(5):  # two decoding sequences in blocks 3 and 5
        m = builder.build(0, common_metadata([1, 1], [10 + step, 20 + step], [3, 5], [False, False]))
        steps.append({"write_pos": m.replay_write_pos.tolist(), "flush_len": m.replay_flush_len.tolist(),
                      "flush_list": flush_list(m)})  # fmt: skip
    # block 3 decodes beside a continuing 5-token chunk in block 5 and a fresh 7-token prompt in block 6 (stale 2)
    for _ in range(2):
        builder.cursors.decode_step(
            torch.tensor([6]), torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
        )
    m = builder.build(0, common_metadata([1, 5, 7], [16, 30, 7], [3, 5, 6], [False, True, True]))
    view = m.prefill_view
    # a second KV-cache group holds the same requests in blocks 2, 1 and 4 and takes this step's metadata
    other_layer, other = layer_and_builder(config, "plan.layers.1.linear_attn")
    theirs = other.update_block_table(m, torch.tensor([[2], [1], [4]], dtype=torch.int32), torch.zeros(0))
    other_group = {
        "supported": other.supports_update_block_table, "indices": theirs.non_spec_state_indices_tensor.tolist(),
        "prefill_indices": theirs.prefill_state_indices.tolist(),
        "view_indices": theirs.prefill_view.non_spec_state_indices_tensor.tolist(),
        "first_view_indices": view.non_spec_state_indices_tensor.tolist(),
        "pending": theirs.replay_pending.tolist(), "view_tokens": theirs.prefill_view.num_actual_tokens,
    }  # fmt: skip
    steps.append({
        "decodes": m.num_decodes, "prefills": m.num_prefills, "write_pos": m.replay_write_pos.tolist(),
        "pending": m.replay_pending.tolist(), "after": builder.cursors.positions.tolist(),
        "fold_pending": m.replay_fold_pending,
        "view": {"decodes": view.num_decodes, "actual_tokens": view.num_actual_tokens,
                 "query_start_loc": view.non_spec_query_start_loc.tolist(),
                 "state_indices": view.non_spec_state_indices_tensor.tolist(),
                 "has_initial_state": view.has_initial_state.tolist(),
                 "conv_programs": view.nums_dict[8]["tot"]},
    })  # fmt: skip
    # a fresh one-token prompt in reused block 5 (state and conv left by its previous owner) decodes beside block 3
    layer.kv_cache[0][5] = 1.0
    layer.kv_cache[1][5] = 1.0
    m = builder.build(0, common_metadata([1, 1], [17, 1], [3, 5], [False, True]))
    other_layer.kv_cache[0][1] = other_layer.kv_cache[1][1] = other_layer.kv_cache[1][2] = 1.0  # blocks 1 and 2
    other.update_block_table(m, torch.tensor([[2], [1]], dtype=torch.int32), torch.zeros(0))
    other_group["fresh_state_zero"] = bool(
        (other_layer.kv_cache[1][1] == 0).all() and (other_layer.kv_cache[0][1] == 0).all()
    )
    other_group["decoding_state_kept"] = bool((other_layer.kv_cache[1][2] == 1).all())
    steps.append({"decodes": m.num_decodes, "write_pos": m.replay_write_pos.tolist(),
                  "fresh_state_zero": bool((layer.kv_cache[1][5] == 0).all() and (layer.kv_cache[0][5] == 0).all()),
                  "other_state_kept": bool((layer.kv_cache[1][3] == 0).all())})  # fmt: skip
    # a builder of its own: a decode beside a fresh 9-token prompt, which the CPU knows has no ring to fold
    fresh_only = type(builder)(builder.kv_cache_spec, [layer.prefix], config, torch.device("cpu"))
    m = fresh_only.build(0, common_metadata([1, 9], [12, 9], [3, 7], [False, True]))
    # per_group_builds: every group builds its own (vLLM then never calls update_block_table), with its own plan
    knobs = {"replayssm": {**ALIGNED_L4["replayssm"], "per_group_builds": True}}
    per_group_config = vllm_config(knobs, tiny, max_model_len=512, dtype="float32")
    per_group = type(builder)(builder.kv_cache_spec, [other_layer.prefix], per_group_config, torch.device("cpu"))
    other_group["per_group_builds"] = {"shares": per_group.supports_update_block_table,
                                       "own_plan": per_group.plan_buffers is not builder.plan_buffers}  # fmt: skip
    return {"steps": steps, "fresh_prompt_fold_pending": m.replay_fold_pending, "other_group": other_group}


def split_precision(model_dir: Path, tiny: Path) -> dict:
    """Split precision through the real layer and builder: the layer spec equals the model classmethods'; the
    builder has no native batches without a measured split limit; a new one-token prompt's copy is zeroed with its
    checkpoint; after vLLM's prefill (which cannot run here, so its place is taken by a stand-in that writes the
    prefill rows' checkpoints, as vLLM's does) the layer copies exactly those checkpoints to bf16."""
    config = vllm_config(ENABLED_SPLIT, model_dir)
    _, model, _ = model_spec(config)
    spec = describe(make_gdn_layer(config, "split_spec.layers.0.linear_attn").get_kv_cache_spec(config))
    knobs = {"replayssm": {**ALIGNED_L4["replayssm"], "split_precision": True}}
    tiny_config = vllm_config(knobs, tiny, max_model_len=512, dtype="float32")
    layer, builder = layer_and_builder(tiny_config, "split.layers.0.linear_attn")
    builder.build(0, common_metadata([1, 1], [10, 20], [3, 5], [False, False]))
    layer.kv_cache[1][5] = layer.kv_cache[STATE_BF16][5] = 1.0  # block 5's previous owner
    layer.kv_cache[STATE_BF16][3] = 2.0
    builder.build(0, common_metadata([1, 1], [11, 1], [3, 5], [False, True]))  # a fresh one-token prompt in 5
    fresh = {"copy_zeroed": bool((layer.kv_cache[STATE_BF16][5] == 0).all()),
             "other_copy_kept": bool((layer.kv_cache[STATE_BF16][3] == 2).all())}  # fmt: skip

    def vllm_prefill_stand_in(self, mixed_qkv, b, a, core_attn_out) -> None:
        view = get_forward_context().attn_metadata[self.prefix]
        self.kv_cache[1][view.non_spec_state_indices_tensor.long()] = 3.0

    m = builder.build(0, common_metadata([1, 5], [12, 5], [3, 6], [False, True]))  # block 3 decodes, 6 prefills
    qkv, b, a = core_inputs(layer, 6, torch.Generator().manual_seed(5), "cpu")
    vllm_forward = QwenGatedDeltaNetAttention._forward_core
    QwenGatedDeltaNetAttention._forward_core = vllm_prefill_stand_in
    try:
        with set_forward_context({layer.prefix: m}, tiny_config):
            layer._prefill(qkv, b, a, torch.zeros(6, layer.num_v_heads, layer.head_v_dim), m,
                           get_forward_context().attn_metadata)  # fmt: skip
    finally:
        QwenGatedDeltaNetAttention._forward_core = vllm_forward
    return {
        "spec": spec, "model_spec": describe(model), "native_max_batch": builder.native_max_batch, "fresh": fresh,
        "copy_after_prefill": bool((layer.kv_cache[STATE_BF16][6] == 3).all()),
        "decode_copy_untouched": bool((layer.kv_cache[STATE_BF16][3] == 2).all()),
    }  # fmt: skip


def native_mixed(tiny: Path) -> dict:
    """``native_mixed_steps``: two decode steps fill two ring entries per row; the mixed step after them is native
    (its decode rows' rings folded into the checkpoint by the builder, cursors restarted) and the decode-only step
    after that replays again from an empty ring."""
    knobs = {"replayssm": {**ALIGNED_L4["replayssm"], "native_mixed_steps": True}}
    config = vllm_config(knobs, tiny, max_model_len=512, dtype="float32")
    layer, builder = layer_and_builder(config, "mixed_native.layers.0.linear_attn")
    for step in range(2):
        builder.build(0, common_metadata([1, 1], [10 + step, 20 + step], [3, 5], [False, False]))
    for ring in (RING_K, RING_U):  # no forward ran, so the rings are empty: fill two entries the fold must apply
        layer.kv_cache[ring][3].normal_()
    before = layer.kv_cache[1][3].clone()
    mixed = builder.build(0, common_metadata([1, 1, 6], [12, 22, 6], [3, 5, 6], [False, False, False]))
    after_mixed = builder.cursors.positions.tolist()
    decode = builder.build(0, common_metadata([1, 1], [13, 23], [3, 5], [False, False]))
    return {"mixed_native": mixed.replay_native, "transition": mixed.replay_transition_pending.tolist(),
            "prefill_view": mixed.prefill_view is not None, "cursors_after_mixed": after_mixed,
            "checkpoint_folded": not torch.equal(before, layer.kv_cache[1][3]),
            "decode_native": decode.replay_native, "decode_write_pos": decode.replay_write_pos.tolist()}  # fmt: skip


def native_scenario(tiny: Path, split: bool = False) -> dict:
    """The native regime (launch-table limit 2 rows) over ``NATIVE_SCHEDULE``: vLLM's GDN layer (its packed decode,
    interpreted), ReplaySSM's, a second ReplaySSM layer in another KV-cache group that holds each request at block
    slot + 4 (its metadata is vLLM's ``update_block_table`` of the first group's, with the full-graph persistent
    buffers on, as on a GPU) and vLLM's layer run from ReplaySSM's state before each native step; then every ring
    is folded. With ``split`` ReplaySSM's layers read a bf16 copy, which their native steps leave stale."""
    gen = torch.Generator().manual_seed(0)
    base_cfg = vllm_config(None, tiny, max_model_len=512, dtype="float32")
    knobs = {"replayssm": {**ALIGNED_L4["replayssm"], "split_precision": split}}
    rep_cfg = vllm_config(knobs, tiny, max_model_len=512, dtype="float32")
    configs = {"base": base_cfg, "rep": rep_cfg, "twin": rep_cfg, "witness": base_cfg}
    tag = "native_split" if split else "native"
    layers = {name: make_gdn_layer(config, f"{tag}_{name}.layers.0.linear_attn") for name, config in configs.items()}
    realistic_gates(layers["base"], gen)
    for name in ("rep", "twin", "witness"):
        layers[name].load_state_dict(layers["base"].state_dict())
    for name, layer in layers.items():
        layer.kv_cache = paged_state_tensors(layer.get_kv_cache_spec(configs[name]), 8)
    group = {name: [layer.prefix] for name, layer in layers.items()}
    limits = {"fp32": NATIVE_LIMIT, "split": NATIVE_LIMIT}
    with launch_table(tiny.parent / f"gdn_{tag}_table.json", {"gdn_native_max_batch": limits}):
        builders = {name: layers[name].get_attn_backend().get_builder_cls()(
            layers[name].get_kv_cache_spec(configs[name]), names, configs[name], torch.device("cpu"))
            for name, names in group.items()}  # fmt: skip
    for name in ("rep", "twin"):  # decode-only steps fill the builders' persistent buffers, as graphs need
        builders[name].use_full_cuda_graph = True
    slots = torch.tensor(NATIVE_SLOTS, dtype=torch.long)
    for index, scale in ((0, 1.0), (1, 0.1)):
        start = torch.randn(layers["base"].kv_cache[index].shape, generator=gen) * scale
        for name in ("base", "rep"):
            layers[name].kv_cache[index].copy_(start)
        layers["twin"].kv_cache[index][slots + OTHER_GROUP_OFFSET] = start[slots]
    if split:  # a prefill leaves the bf16 copy in step with the master
        for name in ("rep", "twin"):
            layers[name].kv_cache[STATE_BF16].copy_(layers[name].kv_cache[1])
    captures = {rows: common_metadata([1] * rows, [1] * rows, [0] * rows, [False] * rows) for rows in (2, 3)}
    captured = {rows: builders["rep"].build_for_cudagraph_capture(md).replay_native for rows, md in captures.items()}
    allocated = builders["rep"].cursors is not None
    base = layers["base"]
    heads, head_v_dim = base.num_v_heads // base.tp_size, base.head_v_dim

    def forward(layer, config, metadata, inputs):
        mixed, b, a = inputs
        out = torch.zeros(mixed.shape[0], heads, head_v_dim)
        with set_forward_context({layer.prefix: metadata}, config):
            layer._forward_core(mixed.clone(), b, a, out)
        return out

    arms = {name: (layers[name], configs[name], built_by(builders[name])) for name in ("base", "rep", "witness")}
    twin_indices = []

    def other_group(slots, seq_lens, first):
        blocks = [slot + OTHER_GROUP_OFFSET for slot in slots]
        theirs = builders["twin"].update_block_table(first, decode_rows(slots, seq_lens, blocks).block_table_tensor,
                                                     torch.zeros(0))  # fmt: skip
        twin_indices.append(
            {
                "indices": theirs.non_spec_state_indices_tensor.tolist(),
                "own_buffer": theirs.non_spec_state_indices_tensor.data_ptr()
                == builders["twin"].non_spec_state_indices_tensor.data_ptr(),
                "shared_plan": theirs.replay_write_pos.data_ptr() == first.replay_write_pos.data_ptr(),
            }
        )
        return theirs  # fmt: skip

    arms["twin"] = (layers["twin"], rep_cfg, other_group)
    run = drive_native_schedule(arms, forward, lambda rows: core_inputs(base, rows, gen, "cpu"),
                                lambda: builders["rep"].cursors)  # fmt: skip
    pending = builders["rep"].cursors.take_pending(slots.int())  # what a prefill of every row would fold first
    layers["rep"].materialise(slots.int(), pending)
    layers["twin"].materialise((slots + OTHER_GROUP_OFFSET).int(), pending)
    rep, twin = layers["rep"], layers["twin"]
    twin_equal = all(torch.equal(twin.kv_cache[index][slots + OTHER_GROUP_OFFSET], rep.kv_cache[index][slots])
                     for index in (0, 1))  # fmt: skip
    return {**run, "captured_native": captured, "table_allocated_by_captures": allocated,
            "pending_at_end": pending.tolist(), "twin_groups": twin_indices,
            "twin_cursor_table": builders["twin"].cursors is not None,
            "state_rel_err": relative_error(rep.kv_cache[1][slots], base.kv_cache[1][slots]),
            "twin_state_equal": twin_equal,
            "conv_state_equal": torch.equal(rep.kv_cache[0][slots], base.kv_cache[0][slots])}  # fmt: skip


# (query lens, seq lens, blocks, prefilling) per step: two rows decode (L = 4, aligned windows), then steps with
# prefills beside them, the first of which folds their rings
MIXED_SCHEDULE = [
    ([1, 1], [21, 31], [1, 2], [False, False]),
    ([1, 1], [22, 32], [1, 2], [False, False]),
    ([1, 1], [23, 33], [1, 2], [False, False]),
    ([1, 1, 6], [24, 34, 6], [1, 2, 4], [False, False, True]),
    ([1, 1, 5], [25, 35, 5], [1, 2, 3], [False, False, True]),
    ([1, 1, 3], [26, 36, 9], [1, 2, 4], [False, False, True]),
]


def mixed_decode_rows(tiny: Path, split: bool = False) -> dict:
    """The decode rows of steps with prefills, through the layer's one-launch path ("one") and its four-launch
    control ("four": vLLM's conv update, then the replay's three launches, which the native-regime check holds
    against vLLM's own decode), on the real builder's metadata and a paged cache, with or without split precision.
    vLLM's GDN prefill cannot run here (its chunked kernels refuse fp32 and need a GPU driver; its conv's grid
    function breaks Triton's interpreter), so the prefill rows are left out: the GPU's served agreement runs them."""
    gen = torch.Generator().manual_seed(11)
    one = {"replayssm": {**ALIGNED_L4["replayssm"], "split_precision": split}}
    four = {"replayssm": {**one["replayssm"], "gdn_one_launch_mixed": False}}
    configs = {name: vllm_config(knobs, tiny, max_model_len=512, dtype="float32")
               for name, knobs in (("one", one), ("four", four))}  # fmt: skip
    layers = {name: make_gdn_layer(config, f"mixed_{name}.layers.0.linear_attn") for name, config in configs.items()}
    realistic_gates(layers["one"], gen)
    layers["four"].load_state_dict(layers["one"].state_dict())
    builders = {}
    for name, layer in layers.items():
        spec = layer.get_kv_cache_spec(configs[name])
        layer.kv_cache = paged_state_tensors(spec, 6)
        builders[name] = layer.get_attn_backend().get_builder_cls()(spec, [layer.prefix], configs[name],
                                                                     torch.device("cpu"))  # fmt: skip
    for index, scale in ((0, 1.0), (1, 0.1)):
        start = torch.randn(layers["one"].kv_cache[index].shape, generator=gen) * scale
        for layer in layers.values():
            layer.kv_cache[index].copy_(start)
            if split and index == 1:  # as a prefill leaves it: the copy of the checkpoint
                layer.kv_cache[STATE_BF16].copy_(start)
    one = layers["one"]
    heads, head_v_dim = one.num_v_heads // one.tp_size, one.head_v_dim
    steps = []
    for query_lens, seq_lens, blocks, prefilling in MIXED_SCHEDULE:
        mixed, b, a = core_inputs(one, sum(query_lens), gen, "cpu")
        outs, flushes, conv_before = {}, None, one.kv_cache[0].clone()
        for name, layer in layers.items():
            metadata = builders[name].build(0, common_metadata(query_lens, seq_lens, blocks, prefilling))
            flushes = metadata.replay_flush_len.tolist()
            outs[name] = torch.zeros(mixed.shape[0], heads, head_v_dim)
            with set_forward_context({layer.prefix: metadata}, configs[name]):
                if metadata.num_prefills:
                    decode = layer._replay_mixed_decode if name == "one" else layer._replay_decode
                    decode(mixed.clone(), b, a, outs[name], metadata)
                else:
                    layer._forward_core(mixed.clone(), b, a, outs[name])
        rows = len(flushes)
        steps.append({"prefills": sum(prefilling), "flush_len": flushes,
                      "rel_err": relative_error(outs["one"][:rows], outs["four"][:rows]),
                      "prefill_rows_untouched": bool((outs["one"][rows:] == 0).all()),
                      "conv_shifted": not torch.equal(one.kv_cache[0][blocks[:rows]], conv_before[blocks[:rows]]),
                      "conv_state_equal": torch.equal(one.kv_cache[0], layers["four"].kv_cache[0]),
                      "rings_equal": all(torch.allclose(x, y, rtol=1e-6, atol=1e-7, equal_nan=True)
                                         for x, y in zip(one.kv_cache[2:], layers["four"].kv_cache[2:], strict=True)),
                      "state_rel_err": relative_error(one.kv_cache[1], layers["four"].kv_cache[1])})  # fmt: skip
    return {"steps": steps}


def whole_model(tiny: Path) -> dict:
    """Every GDN layer of a real tiny Qwen3.5 built with the knob is ReplaySSM's."""
    config = vllm_config(ALIGNED_L4, tiny, max_model_len=512, dtype="float32")
    model_cls, _ = ModelRegistry.resolve_model_cls(config.model_config.architecture, model_config=config.model_config)
    from vllm.config import set_current_vllm_config

    with reporting_cuda():
        model_cls.active_config(config)  # the refusal checks the model's __init__ runs
    install_replay_gdn(replayssm_config_of(config))
    with set_current_vllm_config(config):
        model = model_cls.__mro__[2](vllm_config=config, prefix="model")  # vLLM's class: its __init__ would refuse CPU
    layers = [mod for mod in model.modules() if isinstance(mod, QwenGatedDeltaNetAttention)]
    return {"classes": sorted({type(mod).__name__ for mod in layers}), "layers": len(layers)}


def stock_path(tiny: Path) -> dict:
    """The plugin off, the model built the way vLLM's loader builds it (``initialize_model``): the registered
    ReplaySSM class must take vLLM's keyword path and give every GDN layer vLLM's own class."""
    from vllm.model_executor.model_loader.utils import initialize_model

    config = vllm_config(None, tiny, max_model_len=512, dtype="float32")
    model = initialize_model(vllm_config=config)
    layers = [mod for mod in model.modules() if isinstance(mod, QwenGatedDeltaNetAttention)]
    return {"model_class": type(model).__name__, "classes": sorted({type(mod).__name__ for mod in layers})}


def main(model_dir: Path, tiny: Path, result_file: Path) -> None:
    load_general_plugins()
    init_single_rank(model_dir, "gloo")
    out: dict = {}
    for name, extra in (("disabled", None), ("enabled", ENABLED), ("disabled_after_enabled", None)):
        config = vllm_config(extra, model_dir)
        model_cls, spec, stock = model_spec(config)
        if name == "enabled":
            install_replay_gdn(replayssm_config_of(config))  # what the model class does before building layers
        layer = make_gdn_layer(config, f"{name}.layers.0.linear_attn")
        out[name] = {
            "model_class": model_cls.__name__, "model_spec": describe(spec), "stock_spec": describe(stock),
            "init_parameters": sorted(inspect.signature(model_cls.__init__).parameters),
            "layer_class": type(layer).__name__, "layer_is_stock_class": type(layer) is QwenGatedDeltaNetAttention,
            "layer_spec": describe(layer.get_kv_cache_spec(config)),
            "backend": layer.get_attn_backend().__name__,
            "backend_is_stock": layer.get_attn_backend() is GDNAttentionBackend,
            "builder": layer.get_attn_backend().get_builder_cls().__name__,
        }  # fmt: skip
    out["refused"] = {
        "cpu_platform": refusal(model_dir, {}, cuda=False),
        "bf16_state": refusal(model_dir, {}, mamba_ssm_cache_dtype="bfloat16"),
        "split_precision": refusal(model_dir, {"split_precision": True}),
        "split_native_mixed": refusal(model_dir, {"split_precision": True, "native_mixed_steps": True}),
        "prefix_caching": refusal(model_dir, {}, enable_prefix_caching=True),
        "native_mixed_steps": refusal(model_dir, {"native_mixed_steps": True}),
        "fp32_supported": refusal(model_dir, {}),
    }
    out["builder"] = builder_steps(tiny)
    out["split"] = split_precision(model_dir, tiny)
    out["native"] = native_scenario(tiny)
    out["native_split"] = native_scenario(tiny, split=True)
    out["native_mixed"] = native_mixed(tiny)
    out["mixed_decode_rows"] = mixed_decode_rows(tiny)
    out["mixed_decode_rows_split"] = mixed_decode_rows(tiny, split=True)
    out["stock_path"] = stock_path(tiny)
    out["whole_model"] = whole_model(tiny)
    result_file.write_text(json.dumps(out))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(*map(Path, sys.argv[1:4]))
