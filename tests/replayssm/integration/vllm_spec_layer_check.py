"""Speculative verify on CPU: ReplayMambaMixer2 vs vLLM's MambaMixer2, both with k = 3 speculative tokens.

Run by test_vllm_mamba2_plugin.py in the cached vllm venv (TRITON_INTERPRET=1, CUDA_VISIBLE_DEVICES=""). Both layers
go through their real builders with vLLM's num_accepted_tokens: vLLM's keeps 1 + k state blocks per request and
its SSU reads block num_accepted - 1 and writes all T; ReplaySSM keeps one block and the ring, commits the accepted
prefix in its builder and folds before an overflow. vLLM's SSU does not run in the interpreter, so the baseline's
backend is the fp64 recurrence with vLLM's speculative indexing. Verify outputs of every token (accepted or not)
must agree; at the end the ring is folded as before a prefill and the checkpoint compared with vLLM's state. A second
ReplaySSM layer stands for another KV-cache group: vLLM derives its metadata from the first group's
(``update_block_table``) at its own blocks, and it must answer exactly as the first group's layer.
vLLM's causal-conv update cannot run its varlen (speculative) path in the interpreter (a loaded token count as a
loop bound), so both layers get ``spec_conv_update``, a PyTorch copy of its speculative semantics that also
insists on max_query_len = 1 + k (vLLM's own layer derives it from its 1 + k wide state indices; ReplaySSM's are 1
wide, so the plugin must pass it).
Args: tiny model dir (float32), result file. Writes one JSON object.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import torch

# isort: off
from vllm_layer_check import Fp64SSUBackend  # first: it puts vLLM on its CPU platform before vLLM's config loads

# isort: on
from vllm.config import set_current_vllm_config
from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
from vllm.forward_context import set_forward_context
from vllm.model_executor.layers.mamba import mamba_mixer2
from vllm.model_executor.layers.mamba.ops import ssu_dispatch
from vllm_checks import launch_table

import replayssm_patch.mixer
from replayssm_patch.config import ReplaySSMConfig
from replayssm_patch.gpu.layer_check import (
    common_metadata,
    make_layer,
    paged_state_tensors,
    projected_width,
    realistic_weights,
    relative_error,
    vllm_config,
)
from replayssm_patch.kernels.ground_truth import recurrence_step_fp64
from replayssm_patch.kernels.launch_config import launch_shapes_in_use
from replayssm_patch.mixer import install_replay_mixer
from replayssm_patch.models import ReplayNemotronHForCausalLM

K, BUFFER_LEN, STEPS, ROWS = 3, 4, 10, 3
LAUNCH_TABLE_ENV = "SPEC_CHECK_LAUNCH_TABLE"  # verify / fold launch entries to run the check under (JSON)
T = 1 + K
SPEC = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
# vLLM's blocks per request (1 + k); ReplaySSM's request uses the first of them, so both conv states line up
BLOCKS = [[1 + T * r + j for j in range(T)] for r in range(ROWS)]


class SpecFp64SSUBackend(Fp64SSUBackend):
    """vLLM's speculative SSU semantics over the fp64 recurrence: read block num_accepted - 1, write every token's."""

    def __call__(self, state, x, dt, A, B, C, D, dt_bias, num_accepted_tokens=None, cu_seqlens=None, **kw):
        if num_accepted_tokens is None:
            return super().__call__(state, x, dt, A, B, C, D, dt_bias, **kw)
        src, dst, out = kw["state_batch_indices"], kw["dst_state_batch_indices"], kw["out"]
        for row, (first, last) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True)):
            h = state[src[row, int(num_accepted_tokens[row]) - 1].long()][None].double()
            for j, t in enumerate(range(first, last)):
                tok = slice(t, t + 1)
                y = recurrence_step_fp64(h, x[tok], dt[tok], A, B[tok], C[tok], D=D, dt_bias=dt_bias,
                                         dt_softplus=kw["dt_softplus"])  # fmt: skip
                state[dst[row, j].long()] = h[0].to(state.dtype)
                out[tok] = y.to(out.dtype)
        return None


def spec_conv_update(x, conv_state, weight, bias, activation, *, conv_state_indices, num_accepted_tokens,
                     query_start_loc, max_query_len, **unused):  # fmt: skip
    """vLLM 0.24's speculative causal_conv1d_update in PyTorch. conv_state [blocks, dim, K-1+k]: token j of a row
    sees columns a-1 .. a+K-3 (a = num_accepted) then its own tokens; afterwards the block holds columns a .. a+K-3
    of before followed by the row's tokens, so the next step's window starts at its own num_accepted - 1."""
    assert num_accepted_tokens is not None and max_query_len == T, f"verify conv got max_query_len {max_query_len}"
    width = weight.shape[1]
    out = torch.empty_like(x)
    starts = query_start_loc.tolist()
    for row, block in enumerate(conv_state_indices[:, 0].tolist()):
        first, last = starts[row], starts[row + 1]
        if block == 0 or first == last:
            continue
        offset, state_len = int(num_accepted_tokens[row]) - 1, conv_state.shape[-1] - (max_query_len - (last - first))
        prior = conv_state[block, :, offset : offset + width - 1].float()
        window = torch.cat([prior, x[first:last].T.float()], dim=1)
        for j in range(last - first):
            out[first + j] = torch.nn.functional.silu((window[:, j : j + width] * weight.float()).sum(1) + bias.float())
        kept = state_len - (last - first)
        new = torch.cat([conv_state[block, :, offset + 1 : offset + 1 + kept].float(), x[first:last].T.float()], 1)
        conv_state[block, :, :state_len] = new.to(conv_state.dtype)
    return out


def with_cache_and_builder(layer, config):
    """The layer's paged cache of 1 + ROWS * T blocks (block 0 is the null block) and its real builder."""
    spec = layer.get_kv_cache_spec(config)
    layer.kv_cache = paged_state_tensors(spec, 1 + ROWS * T)
    return layer.get_attn_backend().get_builder_cls()(spec, [layer.prefix], config, torch.device("cpu"))


def step_metadata(builder, accepted: list[int], seq_lens: list[int], blocks, prefilling: bool, query_len: int):
    common = common_metadata([query_len] * ROWS, seq_lens, blocks, [prefilling] * ROWS)
    return builder.build(0, common, num_accepted_tokens=torch.tensor(accepted, dtype=torch.int32))


def main(tiny: Path, result_file: Path) -> None:
    """The check under a launch table whose native limit covers these rows (the verify steps must still be
    ReplaySSM's), plus the verify and fold launch entries of ``LAUNCH_TABLE_ENV`` (JSON) if set."""
    entries = {"native_max_batch": {"fp32": 8}, **json.loads(os.environ.get(LAUNCH_TABLE_ENV, "{}"))}
    with launch_table(tiny.parent / "launch_table.json", entries):
        check(tiny, result_file)


def check(tiny: Path, result_file: Path) -> None:
    # fp32 model dtype: vLLM's CPU platform would pick bf16, and the ring stores x and B in the model dtype
    base_cfg = vllm_config(None, tiny, max_model_len=512, speculative_config=SPEC, dtype="float32")
    knobs = {"enable": True, "buffer_len": BUFFER_LEN, "split_precision": False}
    rep_cfg = vllm_config({"replayssm": knobs}, tiny, max_model_len=512, speculative_config=SPEC, dtype="float32")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(base_cfg):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, backend="gloo")
        ensure_model_parallel_initialized(1, 1)
    ssu_dispatch._mamba_ssu_backend = SpecFp64SSUBackend(base_cfg.mamba_config)
    mamba_mixer2.causal_conv1d_update = replayssm_patch.mixer.causal_conv1d_update = spec_conv_update
    install_replay_mixer(ReplaySSMConfig(enable=True, buffer_len=BUFFER_LEN))
    torch.set_grad_enabled(False)
    gen = torch.Generator().manual_seed(0)
    base, rep = make_layer(base_cfg, "base.mixer"), make_layer(rep_cfg, "rep.mixer")
    other = make_layer(rep_cfg, "other.mixer")  # a layer of the second KV-cache group
    realistic_weights(base, gen)
    rep.load_state_dict(base.state_dict())
    other.load_state_dict(base.state_dict())
    specs = {"base": base.get_kv_cache_spec(base_cfg), "rep": rep.get_kv_cache_spec(rep_cfg)}
    model_shapes = ReplayNemotronHForCausalLM.get_mamba_state_shape_from_config(rep_cfg)
    builders = {"base": with_cache_and_builder(base, base_cfg), "rep": with_cache_and_builder(rep, rep_cfg),
                "other": with_cache_and_builder(other, rep_cfg)}  # fmt: skip
    per_group_cfg = vllm_config({"replayssm": {**knobs, "per_group_builds": True}}, tiny, max_model_len=512,
                                speculative_config=SPEC, dtype="float32")  # fmt: skip
    per_group = with_cache_and_builder(make_layer(per_group_cfg, "per_group.mixer"), per_group_cfg)

    # a capture build before any step: a dry run that allocates and moves no cursor
    capture = builders["rep"].build_for_cudagraph_capture(
        common_metadata([T] * ROWS, [T] * ROWS, [b[0] for b in BLOCKS], [False] * ROWS)
    )  # fmt: skip
    dry = {"write_pos": capture.replay_write_pos.tolist(), "fold_len": capture.replay_fold_len.tolist(),
           "table_allocated": builders["rep"].cursors is not None}  # fmt: skip

    first_blocks = [b[0] for b in BLOCKS]
    other_blocks = [b[1] for b in BLOCKS]
    for index, init in ((0, torch.randn(base.kv_cache[0].shape, generator=gen)),
                        (1, torch.randn(base.kv_cache[1].shape, generator=gen) * 0.5)):  # fmt: skip
        base.kv_cache[index].copy_(init)
        rep.kv_cache[index][first_blocks] = base.kv_cache[index][first_blocks]  # what a prefill leaves in the block
        other.kv_cache[index][other_blocks] = base.kv_cache[index][first_blocks]  # the same requests, other blocks
    width = projected_width(base)
    accepted = [1] * ROWS  # vLLM forces 1 for a request that just prefilled
    errors, plans, recapture_moved, other_equal = [], [], None, []
    for step in range(STEPS):
        projected = torch.randn(ROWS * T, width, generator=gen)
        seq_lens = [40 + 10 * r + T * step for r in range(ROWS)]
        outs = {}
        for name, layer, config, blocks in (("base", base, base_cfg, BLOCKS), ("rep", rep, rep_cfg, first_blocks)):
            md = step_metadata(builders[name], accepted, seq_lens, blocks, False, T)
            outs[name] = torch.zeros(ROWS * T, base.intermediate_size)
            with set_forward_context({layer.prefix: md}, config):
                layer.conv_ssm_forward(projected, outs[name])
            if name == "rep":
                plans.append({"accepted": list(accepted), "write_pos": md.replay_write_pos.tolist(),
                              "fold_len": md.replay_fold_len.tolist()})  # fmt: skip
                table = common_metadata([T] * ROWS, seq_lens, other_blocks, [False] * ROWS).block_table_tensor
                derived = builders["other"].update_block_table(md, table, torch.zeros(0))
                outs["other"] = torch.zeros(ROWS * T, base.intermediate_size)
                with set_forward_context({other.prefix: derived}, config):
                    other.conv_ssm_forward(projected, outs["other"])
                other_equal.append(torch.equal(outs["other"], outs["rep"]))
        errors.append(relative_error(outs["rep"], outs["base"]))
        if step == STEPS // 2:  # vLLM may capture graphs again (e.g. after a resize): still no commit
            before = builders["rep"].cursors.positions.clone(), builders["rep"].cursors.pending.clone()
            builders["rep"].build_for_cudagraph_capture(common_metadata([T] * ROWS, [T] * ROWS, first_blocks,
                                                                         [False] * ROWS))  # fmt: skip
            after = builders["rep"].cursors.positions, builders["rep"].cursors.pending
            recapture_moved = not (torch.equal(before[0], after[0]) and torch.equal(before[1], after[1]))
        # all accepted, all rejected, then mixed
        if step < 6:
            accepted = [T] * ROWS if step < 3 else [1] * ROWS
        else:
            accepted = torch.randint(1, T + 1, (ROWS,), generator=gen).tolist()

    # continuing prefill chunks: the ring (its accepted prefix included) is folded before vLLM's prefill reads it
    plan = step_metadata(builders["rep"], accepted, [200] * ROWS, first_blocks, True, T + 2)
    rep.materialise(plan.state_indices_tensor_p.to(torch.int32), plan.replay_pending)
    table = common_metadata([T + 2] * ROWS, [200] * ROWS, other_blocks, [True] * ROWS).block_table_tensor
    derived = builders["other"].update_block_table(plan, table, torch.zeros(0))  # the second group folds too
    other.materialise(derived.state_indices_tensor_p.to(torch.int32), derived.replay_pending)
    current = [BLOCKS[r][accepted[r] - 1] for r in range(ROWS)]  # vLLM's state after the accepted tokens
    result = {
        "specs": {
            name: {"shapes": [list(s) for s in spec.shapes], "blocks": spec.num_speculative_blocks}
            for name, spec in specs.items()
        },
        "model_shapes": [list(s) for s in model_shapes],
        "capture": dry,
        "native_limit": builders["rep"].native_max_batch,
        "launch_shapes": {key: launch_shapes_in_use("cpu")[key] for key in ("verify", "fold")},
        "recapture_moved_cursors": recapture_moved,
        "output_rel_err": errors,
        "plans": plans,
        "pending": plan.replay_pending.tolist(),
        "state_rel_err_after_fold": relative_error(rep.kv_cache[1][first_blocks], base.kv_cache[1][current]),
        "other_group": {
            "shares": builders["other"].supports_update_block_table,
            "outputs_equal": other_equal,
            "own_table": builders["other"].cursors is not None,
            "same_plan_buffers": builders["other"].plan_buffers is builders["rep"].plan_buffers,
            "states_equal": torch.equal(other.kv_cache[1][other_blocks], rep.kv_cache[1][first_blocks]),
        },
        "per_group_builds": {
            "shares": per_group.supports_update_block_table,
            "own_plan_buffers": per_group.plan_buffers is not builders["rep"].plan_buffers,
        },
    }
    result_file.write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
