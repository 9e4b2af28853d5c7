"""Compile the ReplaySSM kernels for Hopper (sm_90) without a GPU: catches what the interpreter lets through.

    python -m replayssm_patch.kernels.compile_check        # exits 1 if any variant fails to compile

Triton's interpreter runs kernels as NumPy code and accepts things the real compiler rejects (tl.dot shape
limits, type mixing, control flow); this drives the real compiler (Triton -> PTX -> ptxas cubin) for the
variants vLLM uses: bf16 activations, fp32 or bf16 checkpoint, Nemotron-H block sizes, and the GDN kernels
(fp32 checkpoint and ring) at Qwen3.5 block sizes. Run it with TRITON_INTERPRET unset.
"""

from __future__ import annotations

import os
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

HOPPER = GPUTarget("cuda", 90, 32)

_REPLAY_POINTERS = {
    "x_ptr": "*bf16", "dt_ptr": "*fp32", "A_ptr": "*fp32", "B_ptr": "*bf16", "C_ptr": "*bf16", "D_ptr": "*fp32",
    "dt_bias_ptr": "*fp32", "ring_x_ptr": "*bf16", "ring_B_ptr": "*bf16", "ring_dt_ptr": "*fp32",
    "slot_ptr": "*i32", "pos_ptr": "*i32", "out_ptr": "*bf16",
}  # fmt: skip
_FLUSH_POINTERS = {
    "A_ptr": "*fp32", "state_ptr": "*fp32", "ring_x_ptr": "*bf16", "ring_B_ptr": "*bf16", "ring_dt_ptr": "*fp32",
    "slot_ptr": "*i32", "len_ptr": "*i32",
}  # fmt: skip

_GDN_STEP_POINTERS = {
    "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "a_ptr": "*bf16", "b_ptr": "*bf16", "A_log_ptr": "*fp32",
    "dt_bias_ptr": "*fp32", "state_ptr": "*fp32", "ring_k_ptr": "*fp32", "ring_u_ptr": "*fp32",
    "ring_g_ptr": "*fp32", "slot_ptr": "*i32", "pos_ptr": "*i32", "flush_ptr": "*i32", "out_ptr": "*bf16",
    "scale": "fp32",
}  # fmt: skip
_GDN_FLUSH_POINTERS = {
    "state_ptr": "*fp32", "ring_k_ptr": "*fp32", "ring_u_ptr": "*fp32", "ring_g_ptr": "*fp32", "slot_ptr": "*i32",
    "len_ptr": "*i32",
}  # fmt: skip
# Qwen3.5 / Qwen3-Next head dims (128), L = 16, the default block_v: ptxas fits it in 209 registers without
# spills at 4 warps (block_v 32 spills at 4 warps and fits at 8; 64 spills at 8).
_GDN_BLOCKS = {"BLOCK_L": 16, "BLOCK_V": 16, "BLOCK_K": 128}


def compile_for_hopper(
    kernel: triton.JITFunction, pointers: dict[str, str], constexprs: dict[str, object], num_warps: int
) -> int:
    """Compile one specialisation (other scalar arguments as i32); returns the cubin size in bytes."""
    signature = {name: "constexpr" if name in constexprs else pointers.get(name, "i32") for name in kernel.arg_names}
    source = ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={(kernel.arg_names.index(name),): value for name, value in constexprs.items()},
    )
    return len(triton.compile(source, target=HOPPER, options={"num_warps": num_warps}).asm["cubin"])


def variants() -> list[tuple[str, triton.JITFunction, dict[str, str], dict[str, object], int]]:
    """(label, kernel, pointer types, constexprs, num_warps) for the default launch of each variant."""
    from replayssm_patch.kernels.flush import _flush_kernel
    from replayssm_patch.kernels.gdn_decode import _gdn_decode_step_kernel
    from replayssm_patch.kernels.gdn_flush import _gdn_flush_kernel
    from replayssm_patch.kernels.replay_decode import _replay_decode_kernel, default_replay_block_p

    found = []
    for state, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        pointers = {**_REPLAY_POINTERS, "state_ptr": f"*{state}"}
        consts = {"HAS_D": True, "HAS_DT_BIAS": True, "DT_SOFTPLUS": True, "BLOCK_L": 16, "BLOCK_N": 128}
        consts["BLOCK_P"] = default_replay_block_p(dtype)
        found.append((f"replay, {state} checkpoint", _replay_decode_kernel, pointers, consts, 4))
    for copy in (False, True):
        pointers = {**_FLUSH_POINTERS, "bf16_ptr": "*bf16" if copy else "*fp32"}
        consts = {"HAS_BF16": copy, "BLOCK_L": 16, "BLOCK_P": 16, "BLOCK_N": 128, "P_BLOCKS": 4}  # head_dim 64
        found.append((f"flush, bf16 copy {copy}", _flush_kernel, pointers, consts, 4))
    found.append(("gdn decode step", _gdn_decode_step_kernel, _GDN_STEP_POINTERS, _GDN_BLOCKS, 4))
    found.append(("gdn flush", _gdn_flush_kernel, _GDN_FLUSH_POINTERS, _GDN_BLOCKS, 4))
    return found


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("error: unset TRITON_INTERPRET; the compile check needs Triton's real compiler")
        return 2
    failed = 0
    for label, kernel, pointers, consts, num_warps in variants():
        try:
            print(f"{label}: ok, cubin {compile_for_hopper(kernel, pointers, consts, num_warps)} bytes", flush=True)
        except Exception as exc:  # report every variant, then fail
            failed += 1
            print(f"{label}: FAILED {type(exc).__name__}: {exc}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
