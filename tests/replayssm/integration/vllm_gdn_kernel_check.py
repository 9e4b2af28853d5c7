"""The GDN ReplaySSM decode step against vLLM 0.24's own GDN decode kernels, both under Triton's interpreter.

Run by test_vllm_gdn_plugin.py in the cached CPU venv with TRITON_INTERPRET=1 and CUDA_VISIBLE_DEVICES="".
Arg: result file (one JSON object). Not collected by pytest (no test_ prefix): the main venv has no vLLM.

Baseline: ``fused_recurrent_gated_delta_rule_packed_decode`` (vLLM's pure-decode path, the default),
advancing its own copy of the state in place. Inputs as vLLM hands them: q, k, v, a, b in the model dtype.
vLLM's mixed-step kernel (``fused_sigmoid_gating_delta_rule_update``) does not run in Triton 3.6's
interpreter (its loop over a runtime token count fails), so it is left to the GPU check.
"""

from __future__ import annotations

import json
import math
import sys

import torch
import vllm.model_executor.layers.fla.ops.fused_recurrent as fused_recurrent

from replayssm_patch.gpu.gdn_layer_check import interpretable_exp
from replayssm_patch.kernels import GdnReplayCache, decode_flush_len, gdn_decode_step, gdn_ring_shapes
from replayssm_patch.kernels.gdn_synthetic import GdnLayerParams, GdnStepInputs

fused_recurrent.exp = interpretable_exp  # vLLM's fla ops bind tl.exp at import, which the interpreter cannot patch

NUM_K_HEADS, NUM_V_HEADS, HEAD_K_DIM, HEAD_V_DIM = 2, 4, 16, 32
SLOTS = torch.tensor([3, 1, 0, 4], dtype=torch.int32)  # 0: vLLM's null block (a padded row)
REAL = [0, 1, 3]


def packed_decode(step: GdnStepInputs, layer: GdnLayerParams, state: torch.Tensor) -> torch.Tensor:
    batch = step.v.shape[0]
    mixed = torch.cat([step.q.flatten(1), step.k.flatten(1), step.v.flatten(1)], dim=1)
    out = torch.full((batch, 1, NUM_V_HEADS, HEAD_V_DIM), 7.0)
    fused_recurrent.fused_recurrent_gated_delta_rule_packed_decode(
        mixed, step.a, step.b, layer.A_log, layer.dt_bias, HEAD_K_DIM**-0.5, state, out, SLOTS,
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    return out[:, 0]


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    scale = expected.abs().max().item()
    return (actual.double() - expected.double()).abs().max().item() / max(scale, 1e-30)


def run(ring_len: int, steps: int, dtype: torch.dtype, seed: int) -> dict:
    """Drive both for ``steps`` decode steps from one random checkpoint; per step: equal outputs and states?"""
    gen = torch.Generator().manual_seed(seed)
    layer = GdnLayerParams.random(NUM_V_HEADS, gen)
    spec = gdn_ring_shapes(NUM_K_HEADS, NUM_V_HEADS, HEAD_K_DIM, HEAD_V_DIM, ring_len)
    cache = GdnReplayCache.allocate(5, spec, ring_fill=math.nan)
    cache.ssm_state.copy_(torch.randn(cache.ssm_state.shape, generator=gen))
    vllm_state = cache.ssm_state.clone()
    write_pos = torch.zeros(len(SLOTS), dtype=torch.int32)
    got = {"output_equal": [], "state_equal_after_fold": [], "output_rel_err": [], "state_rel_err_after_fold": []}
    for _ in range(steps):
        step = GdnStepInputs.random(
            len(SLOTS), NUM_K_HEADS, HEAD_K_DIM, HEAD_V_DIM, layer, gen, dtype, gate_dtype=dtype
        )
        flush_len = decode_flush_len(write_pos, ring_len)
        out = torch.full((len(SLOTS), NUM_V_HEADS, HEAD_V_DIM), 7.0)
        ours = gdn_decode_step(
            step.q, step.k, step.v, step.a, step.b, layer.A_log, layer.dt_bias, cache.ssm_state, cache.ring_k,
            cache.ring_u, cache.ring_g, SLOTS, write_pos, flush_len, pad_slot_id=0, out=out,
        )  # fmt: skip
        theirs = packed_decode(step, layer, vllm_state)
        got["output_equal"].append(torch.equal(ours[REAL], theirs[REAL]))
        got["output_rel_err"].append(rel_err(ours[REAL], theirs[REAL]))
        if flush_len[0] > 0:
            real_slots = SLOTS[REAL].long()
            got["state_equal_after_fold"].append(torch.equal(cache.ssm_state[real_slots], vllm_state[real_slots]))
            got["state_rel_err_after_fold"].append(rel_err(cache.ssm_state[real_slots], vllm_state[real_slots]))
        got["null_row"] = {"ours_left_alone": bool((ours[2] == 7.0).all()), "vllm": theirs[2].abs().max().item()}
        write_pos = (write_pos + 1) % ring_len
    return got


def main(result_path: str) -> None:
    result = {}
    for dtype in (torch.float32, torch.bfloat16):
        label = str(dtype).removeprefix("torch.")
        result[f"L1/{label}"] = run(ring_len=1, steps=6, dtype=dtype, seed=1)
        result[f"L4/{label}"] = run(ring_len=4, steps=18, dtype=dtype, seed=2)
    with open(result_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[-1])
