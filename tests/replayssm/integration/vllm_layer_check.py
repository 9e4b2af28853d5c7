"""Layer-level equivalence on CPU: ReplayMambaMixer2 vs vLLM's MambaMixer2 through their real builders.

Run by test_vllm_mamba2_plugin.py in the cached vllm venv with TRITON_INTERPRET=1 and CUDA_VISIBLE_DEVICES=""
(vLLM then keeps Triton on, and its causal-conv update and the ReplaySSM kernels run in the interpreter).
vLLM's selective_state_update does not run in the interpreter, so the baseline layer's SSU backend is the
fp64 sequential recurrence (replayssm_patch.kernels.ground_truth). vLLM's prefill conv kernel does not run
there either, so materialise-before-prefill is checked on the state the layer's fold leaves. The native regime
(vLLM's own decode at small batches) runs ``vllm_checks.NATIVE_SCHEDULE``.
Args: tiny model dir (float32), result file. Writes one JSON object.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
from pathlib import Path

import torch
import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform

platforms.current_platform = CpuPlatform()
import vllm.utils.torch_utils as torch_utils  # noqa: E402

torch_utils.PIN_MEMORY = False
torch.accelerator.empty_cache = lambda: None  # the profile run's warm-up frees GPU cache; there is none here
from vllm.config import set_current_vllm_config  # noqa: E402
from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2  # noqa: E402
from vllm.model_executor.layers.mamba.ops import ssu_dispatch  # noqa: E402
from vllm_checks import (  # noqa: E402
    NATIVE_LIMIT,
    NATIVE_SLOTS,
    built_by,
    decode_rows,
    drive_native_schedule,
    launch_table,
)

from replayssm_patch.config import ReplaySSMConfig  # noqa: E402
from replayssm_patch.gpu.layer_check import (  # noqa: E402
    common_metadata,
    make_layer,
    paged_state_tensors,
    projected_width,
    realistic_weights,
    relative_error,
    vllm_config,
)
from replayssm_patch.kernels.ground_truth import recurrence_step_fp64  # noqa: E402
from replayssm_patch.mixer import install_replay_mixer  # noqa: E402
from replayssm_patch.state_layout import STATE_BF16  # noqa: E402

NUM_BLOCKS, BUFFER_LEN, DECODE_STEPS = 6, 4, 9
SLOTS = [1, 2, 3]


class Fp64SSUBackend(ssu_dispatch.MambaSSUBackend):
    """vLLM SSU backend interface over the fp64 recurrence (single-token decode rows only)."""

    name = "fp64-reference"

    def __call__(self, state, x, dt, A, B, C, D, dt_bias, z=None, dt_softplus=False, state_batch_indices=None,
                 dst_state_batch_indices=None, null_block_id=0, out=None, **unused):  # fmt: skip
        h = state[state_batch_indices.reshape(-1).long()].double()
        y = recurrence_step_fp64(h, x, dt, A, B, C, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus)
        state[dst_state_batch_indices.reshape(-1).long()] = h.to(state.dtype)
        out.copy_(y.to(out.dtype))


def with_cache_and_builder(layer: MambaMixer2, config, num_blocks: int = NUM_BLOCKS):
    spec = layer.get_kv_cache_spec(config)
    layer.kv_cache = paged_state_tensors(spec, num_blocks)
    return layer.get_attn_backend().get_builder_cls()(spec, [layer.prefix], config, torch.device("cpu"))


def profile_run(layer: MambaMixer2, config) -> str:
    """vLLM's profile run calls the layer with no attention metadata (its SSD warm-up reads get_state_dtype)."""
    projected = torch.randn(4, projected_width(layer))
    try:
        with set_forward_context(None, config), torch.no_grad():
            layer.conv_ssm_forward(projected, torch.zeros(4, layer.intermediate_size))
    except Exception as error:  # reported, and asserted on, by the test
        return f"{type(error).__name__}: {error}"
    return "ok"


def startup_warm(builder, layer: MambaMixer2) -> dict:
    """A capture build (vLLM's start-up) launches the layer's materialise fold once on the null block: the
    builder says so, and no tensor of the layer's cache changes."""
    before = [t.clone() for t in layer.kv_cache]
    builder.build_for_cudagraph_capture(common_metadata([1, 1], [1, 1], [0, 0], [False, False]))
    same = all(bool(((a == b) | (a.isnan() & b.isnan())).all()) for a, b in zip(before, layer.kv_cache, strict=True))
    allocated = builder.cursors is not None
    return {"warmed": builder.eager_kernels_warmed, "cache_unchanged": same, "table_allocated": allocated}


def scenario(tiny: Path, split: bool, gen: torch.Generator) -> dict:
    """Decode DECODE_STEPS steps on both layers (flushes at L-1), then fold the ring as before a prefill."""
    base_cfg = vllm_config(None, tiny, max_model_len=512)
    knobs = {"enable": True, "buffer_len": BUFFER_LEN, "split_precision": split, "stagger_windows": False}
    rep_cfg = vllm_config({"replayssm": knobs}, tiny, max_model_len=512)
    tag = "split" if split else "fp32"
    base, rep = make_layer(base_cfg, f"base_{tag}.mixer"), make_layer(rep_cfg, f"rep_{tag}.mixer")
    realistic_weights(base, gen)
    with torch.no_grad():
        rep.load_state_dict(base.state_dict())
    profiled = profile_run(rep, rep_cfg)
    builders = {"base": with_cache_and_builder(base, base_cfg), "rep": with_cache_and_builder(rep, rep_cfg)}
    conv0 = torch.randn(base.kv_cache[0].shape, generator=gen)
    ssm0 = torch.randn(base.kv_cache[1].shape, generator=gen) * 0.5
    for layer in (base, rep):
        layer.kv_cache[0].copy_(conv0)
        layer.kv_cache[1].copy_(ssm0)
    if split:  # a prefill leaves the bf16 copy in step with the master
        rep.kv_cache[STATE_BF16].copy_(ssm0.to(torch.bfloat16))
    warm = startup_warm(builders["rep"], rep)
    width = projected_width(base)
    errors, cursors = [], []
    for step in range(DECODE_STEPS):
        projected = torch.randn(len(SLOTS), width, generator=gen)
        outs = {}
        for name, layer, config in (("base", base, base_cfg), ("rep", rep, rep_cfg)):
            seq_lens = [20 + 10 * i + step for i in range(len(SLOTS))]
            md = builders[name].build(0, common_metadata([1] * len(SLOTS), seq_lens, SLOTS, [False] * len(SLOTS)))
            outs[name] = torch.zeros(len(SLOTS), base.intermediate_size)
            with set_forward_context({layer.prefix: md}, config), torch.no_grad():
                layer.conv_ssm_forward(projected, outs[name])
        errors.append(relative_error(outs["rep"], outs["base"]))
        cursors.append(builders["rep"].cursors.positions[SLOTS].tolist())
    # prefill rows that continue a sequence (SLOTS, 5 more tokens each) beside a fresh prompt (slot 4): what the
    # continuing rows' rings hold is folded into the checkpoint before vLLM's prefill would read it
    plan = builders["rep"].build(0, common_metadata([5, 5, 5, 5], [45, 55, 65, 5], [*SLOTS, 4], [True] * 4))
    with torch.no_grad():
        rep.materialise(plan.state_indices_tensor_p.to(torch.int32), plan.replay_pending)
    return {"profile_run": profiled, "startup_warm": warm, "state_dtypes": [str(d) for d in rep.get_state_dtype()],
            "output_rel_err": errors, "cursors": cursors, "pending": plan.replay_pending.tolist(),
            "state_rel_err_after_fold": relative_error(rep.kv_cache[1][SLOTS], base.kv_cache[1][SLOTS]),
            "conv_state_equal": bool(torch.equal(rep.kv_cache[0][SLOTS], base.kv_cache[0][SLOTS]))}  # fmt: skip


def other_group_block(slot: int) -> int:
    """The block a second KV-cache group holds for the request in ``slot`` (vLLM gives each group its own)."""
    return NUM_BLOCKS - slot


def native_scenario(tiny: Path, gen: torch.Generator, split: bool = False) -> dict:
    """The native regime (launch-table limit 2 rows) over ``NATIVE_SCHEDULE``: vLLM's layer, ReplaySSM's, a second
    KV-cache group (vLLM's update_block_table of the first group's metadata, other blocks), and vLLM's layer run
    from ReplaySSM's state before each native step; then every ring is folded and the checkpoints compared. With
    ``split`` ReplaySSM's layers read a bf16 copy, which their native steps leave stale."""
    base_cfg = vllm_config(None, tiny, max_model_len=512)
    knobs = {"enable": True, "buffer_len": BUFFER_LEN, "stagger_windows": False, "split_precision": split}
    rep_cfg = vllm_config({"replayssm": knobs}, tiny, max_model_len=512)
    configs = {"base": base_cfg, "rep": rep_cfg, "twin": rep_cfg, "witness": base_cfg}
    tag = "native_split" if split else "native"
    layers = {name: make_layer(config, f"{tag}_{name}.mixer") for name, config in configs.items()}
    realistic_weights(layers["base"], gen)
    for name in ("rep", "twin", "witness"):
        layers[name].load_state_dict(layers["base"].state_dict())
    limits = {"fp32": NATIVE_LIMIT, "split": NATIVE_LIMIT}
    with launch_table(tiny.parent / f"{tag}_table.json", {"native_max_batch": limits}):
        builders = {name: with_cache_and_builder(layers[name], config) for name, config in configs.items()}
    rep, twin = layers["rep"], layers["twin"]
    twin_blocks = [other_group_block(slot) for slot in NATIVE_SLOTS]
    for index, scale in ((0, 1.0), (1, 0.5)):
        start = torch.randn(rep.kv_cache[index].shape, generator=gen) * scale
        for layer in (layers["base"], rep):
            layer.kv_cache[index].copy_(start)
        twin.kv_cache[index][twin_blocks] = start[list(NATIVE_SLOTS)].to(twin.kv_cache[index].dtype)
    if split:  # a prefill leaves the bf16 copy in step with the master
        for layer in (rep, twin):
            layer.kv_cache[STATE_BF16].copy_(layer.kv_cache[1])
    captures = {rows: common_metadata([1] * rows, [1] * rows, [0] * rows, [False] * rows) for rows in (2, 3)}
    captured = {rows: builders["rep"].build_for_cudagraph_capture(md).replay_native for rows, md in captures.items()}
    allocated = builders["rep"].cursors is not None

    def other_group(slots, seq_lens, first):
        theirs = decode_rows(slots, seq_lens, [other_group_block(slot) for slot in slots])
        return builders["twin"].update_block_table(first, theirs.block_table_tensor, theirs.slot_mapping)

    def forward(layer, config, metadata, inputs):
        out = torch.zeros(inputs[0].shape[0], layer.intermediate_size)
        with set_forward_context({layer.prefix: metadata}, config):
            layer.conv_ssm_forward(inputs[0], out)
        return out

    arms = {name: (layers[name], configs[name], built_by(builders[name])) for name in ("base", "rep", "witness")}
    arms["twin"] = (twin, rep_cfg, other_group)
    width = projected_width(rep)
    run = drive_native_schedule(arms, forward, lambda rows: (torch.randn(rows, width, generator=gen),),
                                lambda: builders["rep"].cursors)  # fmt: skip
    slots = torch.tensor(NATIVE_SLOTS, dtype=torch.int32)
    pending = builders["rep"].cursors.take_pending(slots)  # what a prefill of every row would fold first
    rep.materialise(slots, pending)
    twin.materialise(torch.tensor(twin_blocks, dtype=torch.int32), pending)
    base = layers["base"]
    return {**run, "captured_native": captured, "table_allocated_by_captures": allocated,
            "pending_at_end": pending.tolist(),
            "state_rel_err": relative_error(rep.kv_cache[1][slots.long()], base.kv_cache[1][slots.long()]),
            "twin_state_equal": torch.equal(twin.kv_cache[1][twin_blocks], rep.kv_cache[1][slots.long()]),
            "conv_state_equal": torch.equal(rep.kv_cache[0][slots.long()], base.kv_cache[0][slots.long()])}  # fmt: skip


def native_flag_steps(tiny: Path) -> list[dict]:
    """A builder under a native limit of 2 rows: a replay step of blocks 1, 2, 4, then native steps: block 1 beside
    a fresh prompt (block 2 left out, as a spent token budget can), then blocks 1 and 2 twice, decode-only."""
    knobs = {"enable": True, "buffer_len": BUFFER_LEN, "stagger_windows": False}  # windows aligned to the prefill
    config = vllm_config({"replayssm": knobs}, tiny, max_model_len=512)
    with launch_table(tiny.parent / "flag_table.json", {"native_max_batch": {"fp32": NATIVE_LIMIT}}):
        builder = with_cache_and_builder(make_layer(config, "flags.mixer"), config)
    schedule = [decode_rows([1, 2, 4], [11, 21, 41]), common_metadata([1, 7], [12, 7], [1, 5], [False, True]),
                decode_rows([1, 2], [13, 22]), decode_rows([1, 2], [14, 23])]  # fmt: skip
    steps = []
    for step in schedule:
        m = builder.build(0, step)
        transition = m.replay_transition_pending
        steps.append({"native": m.replay_native, "transition": None if transition is None else transition.tolist(),
                      "ring_may_hold": builder.ring_may_hold})  # fmt: skip
    return steps


def native_mixed_flag_steps(tiny: Path) -> list[dict]:
    """native_mixed_steps, no native batch limit: two replay steps of blocks 1 and 2, then a step with a fresh
    prompt beside them (native: their two entries each folded, cursors restarted), then decode-only again (replay
    from write position 0), then a new one-token prompt beside them: one-token rows only, which vLLM may run as a
    decode graph captured in the replay regime, so it stays a replay step."""
    knobs = {"enable": True, "buffer_len": BUFFER_LEN, "stagger_windows": False, "native_mixed_steps": True}
    config = vllm_config({"replayssm": knobs}, tiny, max_model_len=512)
    with launch_table(tiny.parent / "mixed_table.json", {"native_max_batch": {"fp32": 0}}):
        builder = with_cache_and_builder(make_layer(config, "mixed_native.mixer"), config)
    mixed = common_metadata([1, 1, 7], [13, 23, 7], [1, 2, 5], [False, False, True])
    one_token_prompt = common_metadata([1, 1, 1], [15, 25, 1], [1, 2, 3], [False, False, True])
    schedule = [decode_rows([1, 2], [11, 21]), decode_rows([1, 2], [12, 22]), mixed, decode_rows([1, 2], [14, 24]),
                one_token_prompt]  # fmt: skip
    steps = []
    for step in schedule:
        m = builder.build(0, step)
        transition = m.replay_transition_pending
        steps.append({"native": m.replay_native, "transition": None if transition is None else transition.tolist(),
                      "write_pos": None if m.replay_native else m.replay_write_pos.tolist()})  # fmt: skip
    return steps


def logged_by(action, logger_name: str) -> list[str]:
    """Messages ``action`` logs at INFO or above on ``logger_name`` (the test env quiets vLLM to WARNING)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        action()
    finally:
        logger.removeHandler(handler)
    return [record.getMessage() for record in records]


def main(tiny: Path, result_file: Path) -> None:
    config = vllm_config(None, tiny, max_model_len=512)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(config):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, backend="gloo")
        ensure_model_parallel_initialized(1, 1)
    ssu_dispatch._mamba_ssu_backend = Fp64SSUBackend(config.mamba_config)  # baseline SSU on CPU
    logged = logged_by(lambda: install_replay_mixer(ReplaySSMConfig(enable=True, buffer_len=BUFFER_LEN)),
                       "vllm.replayssm_patch.mixer")  # fmt: skip
    torch.set_grad_enabled(False)
    gen = torch.Generator().manual_seed(0)
    result = {"fp32": scenario(tiny, False, gen), "split": scenario(tiny, True, gen), "install_log": logged,
              "native": native_scenario(tiny, gen), "native_split": native_scenario(tiny, gen, split=True),
              "native_flags": native_flag_steps(tiny),
              "native_mixed_flags": native_mixed_flag_steps(tiny)}  # fmt: skip
    result_file.write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
