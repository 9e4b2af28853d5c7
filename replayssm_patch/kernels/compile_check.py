"""Compile the ReplaySSM kernels for Hopper (sm_90) without a GPU: catches what the interpreter lets through.

    python -m replayssm_patch.kernels.compile_check        # exits 1 if any variant fails to compile

Triton's interpreter runs kernels as NumPy code and accepts things the real compiler rejects (tl.dot shape
limits, type mixing, control flow); this drives the real compiler (Triton -> PTX -> ptxas cubin) for the
variants vLLM uses, with the registers ptxas gives each (they decide how many programs an SM holds):
bf16 activations, fp32 or bf16 checkpoint, Nemotron-H block sizes, the cursor plans (the take before a prefill
with every flag on), the speculative verify and its plan at T = 4 (MTP k = 3, ring L + T = 20), and the GDN
kernels (fp32 checkpoint and ring) at Qwen3.5 block sizes, the mixed-step one with its conv of width 4. Run it
with TRITON_INTERPRET unset.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource, CompiledKernel

from replayssm_patch.kernels.common import register_cap

HOPPER = GPUTarget("cuda", 90, 32)

_COEF_POINTERS = {
    "dt_ptr": "*fp32", "A_ptr": "*fp32", "B_ptr": "*bf16", "C_ptr": "*bf16", "dt_bias_ptr": "*fp32",
    "ring_B_ptr": "*bf16", "ring_dt_ptr": "*fp32", "slot_ptr": "*i32", "pos_ptr": "*i32", "bc_ptr": "*fp32",
    "w_ptr": "*fp32", "decay_ptr": "*fp32",
}  # fmt: skip
_STEP_POINTERS = {
    "x_ptr": "*bf16", "C_ptr": "*bf16", "D_ptr": "*fp32", "ring_x_ptr": "*bf16", "slot_ptr": "*i32",
    "pos_ptr": "*i32", "flush_ptr": "*i32", "bc_ptr": "*fp32", "w_ptr": "*fp32", "decay_ptr": "*fp32",
    "out_ptr": "*bf16",
}  # fmt: skip
_FOLD_POINTERS = {
    "x_ptr": "*bf16", "C_ptr": "*bf16", "D_ptr": "*fp32", "master_ptr": "*fp32", "ring_x_ptr": "*bf16",
    "ring_B_ptr": "*bf16", "slot_ptr": "*i32", "pos_ptr": "*i32", "rows_ptr": "*i32", "count_ptr": "*i32",
    "w_ptr": "*fp32", "decay_ptr": "*fp32", "out_ptr": "*bf16",
}  # fmt: skip
# Triton specialises integer arguments equal to 1 at launch; the innermost strides are, in every real launch, so
# they are fixed here too: without them the compiler cannot vectorise and reports other register counts.
_UNIT_STRIDES = {name: 1 for name in ("sx_p", "sC_n", "sr_n", "srx_p", "so_p")}
_FOLD_UNIT_STRIDES = {name: 1 for name in ("sx_p", "sC_n", "sm_n", "sc_n", "srx_p", "srB_n", "so_p")}
_VERIFY_UNIT_STRIDES = {name: 1 for name in ("sx_p", "sC_n", "sr_n", "srx_p", "so_p")}
_VERIFY_COEF_POINTERS = {**_COEF_POINTERS, "qsl_ptr": "*i32", "c32_ptr": "*fp32"}
_VERIFY_STEP_POINTERS = {
    "x_ptr": "*bf16", "C_ptr": "*bf16", "c32_ptr": "*fp32", "D_ptr": "*fp32", "ring_x_ptr": "*bf16", "slot_ptr": "*i32",
    "pos_ptr": "*i32", "qsl_ptr": "*i32", "bc_ptr": "*fp32", "w_ptr": "*fp32", "decay_ptr": "*fp32", "out_ptr": "*bf16",
}  # fmt: skip
_FLUSH_POINTERS = {
    "A_ptr": "*fp32", "state_ptr": "*fp32", "ring_x_ptr": "*bf16", "ring_B_ptr": "*bf16", "ring_dt_ptr": "*fp32",
    "slot_ptr": "*i32", "len_ptr": "*i32", "rows_ptr": "*i32", "count_ptr": "*i32",
}  # fmt: skip

_GDN_SCRATCH_POINTERS = {
    name: "*fp32" for name in ("qhat_ptr", "khat_ptr", "kk_ptr", "kq_ptr", "weight_ptr", "decay_ptr", "beta_ptr")
}
_GDN_COEF_POINTERS = {
    "q_ptr": "*bf16", "k_ptr": "*bf16", "a_ptr": "*bf16", "b_ptr": "*bf16", "A_log_ptr": "*fp32",
    "dt_bias_ptr": "*fp32", "ring_k_ptr": "*fp32", "ring_g_ptr": "*fp32", "ring_beta_ptr": "*fp32", "slot_ptr": "*i32",
    "pos_ptr": "*i32", "scale": "fp32", **_GDN_SCRATCH_POINTERS,
}  # fmt: skip
# split precision's tensors (typed as split precision has them; without it the kernels never touch them)
_GDN_SPLIT_POINTERS = {"copy_ptr": "*bf16", "ring_v_ptr": "*bf16", "ring_beta_ptr": "*fp32"}
_GDN_REPLAY_POINTERS = {
    "v_ptr": "*bf16", "state_ptr": "*fp32", "ring_u_ptr": "*fp32", "ring_v_ptr": "*bf16", "slot_ptr": "*i32",
    "pos_ptr": "*i32", "flush_ptr": "*i32", "out_ptr": "*bf16", "key_query_ptr": "*fp32", **_GDN_SCRATCH_POINTERS,
}  # fmt: skip
_GDN_FOLD_POINTERS = {
    **_GDN_REPLAY_POINTERS, **_GDN_SPLIT_POINTERS, "ring_k_ptr": "*fp32", "ring_g_ptr": "*fp32", "rows_ptr": "*i32",
    "count_ptr": "*i32",
}  # fmt: skip
_GDN_MIXED_POINTERS = {
    "x_ptr": "*bf16", "conv_ptr": "*bf16", "cw_ptr": "*bf16", "cb_ptr": "*bf16", "a_ptr": "*bf16", "b_ptr": "*bf16",
    "A_log_ptr": "*fp32", "dt_bias_ptr": "*fp32", "state_ptr": "*fp32", "ring_k_ptr": "*fp32", "ring_u_ptr": "*fp32",
    "ring_g_ptr": "*fp32", "slot_ptr": "*i32", "pos_ptr": "*i32", "flush_ptr": "*i32", "out_ptr": "*bf16",
    "scale": "fp32", **_GDN_SPLIT_POINTERS,
}  # fmt: skip
# innermost strides of the GDN tensors (the ring_g and gate tensors are [..., num_v_heads]; mixed_qkv's channels;
# the conv weight's taps)
_GDN_UNIT_STRIDES = {
    "sq_k", "sk_k", "sa_h", "sb_h", "sv_v", "ss_k", "srk_k", "sru_v", "srg_h", "so_v", "sx_c", "sw_t", "sc_k", "srv_v",
    "srb_h", "scp_k",
}  # fmt: skip


def _unit_strides(kernel: triton.JITFunction, names: set[str]) -> dict[str, int]:
    """The unit strides among ``names`` that ``kernel`` takes (constexprs must name its own arguments)."""
    return {name: 1 for name in kernel.arg_names if name in names}


_GDN_FLUSH_POINTERS = {
    "state_ptr": "*fp32", "ring_k_ptr": "*fp32", "ring_u_ptr": "*fp32", "ring_g_ptr": "*fp32", "slot_ptr": "*i32",
    "len_ptr": "*i32", **_GDN_SPLIT_POINTERS,
}  # fmt: skip
# Qwen3.5 / Qwen3-Next (TP 1): head dims 128, 2 value heads per key head, L = 16; the materialise fold keeps
# its own default block_v of 16.
_GDN_BLOCKS = {"BLOCK_L": 16, "BLOCK_K": 128}


@dataclass(frozen=True)
class Compiled:
    """What ptxas says of one kernel specialisation: registers per thread decide how many programs an SM holds."""

    cubin_bytes: int
    registers: int
    spill_bytes: int


# Integer arguments that are multiples of 16 in every real launch (strides, head_dim, d_state, head and ring
# counts): Triton specialises those at launch (divisibility 16), which lets it vectorise; without the hint the
# compiler reports the registers of scalar address arithmetic, far above what the GPU runs.
_ALIGNED_SCALAR = re.compile(
    r"^(s[a-zA-Z]*_[a-z]+|head_dim|head_[kv]_dim|d_state|nheads|num_v_heads|heads_per_group|ring_len|buffer_len)$"
)


def compile_for_hopper(
    kernel: triton.JITFunction, pointers: dict[str, str], constexprs: dict[str, object], num_warps: int
) -> Compiled:
    """Compile one specialisation (``hopper_kernel``) and read its register use from ``ptxas -v``."""
    compiled = hopper_kernel(kernel, pointers, constexprs, num_warps)
    registers, spills = ptxas_usage(compiled.asm["ptx"])
    return Compiled(len(compiled.asm["cubin"]), registers, spills)


def hopper_kernel(
    kernel: triton.JITFunction, pointers: dict[str, str], constexprs: dict[str, object], num_warps: int,
    maxnreg: int = 0,
) -> CompiledKernel:  # fmt: skip
    """One specialisation compiled for sm_90 (other scalar arguments as i32), capped at ``maxnreg`` registers (0:
    none), specialised as a launch of the real shapes would be: pointers 16-byte aligned unless the kernel opts out
    (``do_not_specialize_on_alignment``), the scalars ``_ALIGNED_SCALAR`` names divisible by 16."""
    if missing := [param.name for param in kernel.params if param.is_constexpr and param.name not in constexprs]:
        # else each would compile as an i32 argument: both sides of its branches, and other register counts
        raise ValueError(f"{kernel.__name__}: no value for the constexprs {missing}")
    signature = {name: "constexpr" if name in constexprs else pointers.get(name, "i32") for name in kernel.arg_names}
    unaligned = set(kernel.do_not_specialize_on_alignment or ()) | set(kernel.do_not_specialize or ())
    aligned = [
        i for i, name in enumerate(kernel.arg_names)
        if name not in unaligned and name not in constexprs
        and (signature[name].startswith("*") or (signature[name] == "i32" and _ALIGNED_SCALAR.match(name)))
    ]  # fmt: skip
    source = ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={(kernel.arg_names.index(name),): value for name, value in constexprs.items()},
        attrs={(i,): [["tt.divisibility", 16]] for i in aligned},
    )
    return triton.compile(source, target=HOPPER, options={"num_warps": num_warps} | register_cap(maxnreg))


def ptxas_usage(ptx: str) -> tuple[int, int]:
    """(registers per thread, spill store bytes of every function) of a PTX module for sm_90a, from Triton's bundled
    ptxas."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        done = subprocess.run(
            [get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", str(source), "-o", str(Path(tmp) / "kernel.cubin")],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    registers = re.search(r"Used (\d+) registers", done.stderr)  # the entry function's, which its callees share
    spills = re.findall(r"(\d+) bytes spill stores", done.stderr)  # the entry's and each noinline callee's
    return int(registers.group(1)) if registers else 0, sum(map(int, spills))


def verify_step_launch(
    read: str, tokens: int, block_p: int, block_n: int, stages: int, ring: bool, pdl: bool = False, heads: int = 1,
    tma: bool = False,
) -> tuple[dict[str, str], dict[str, object]]:  # fmt: skip
    """Pointer types and constexprs of the verify's output launch as the engine sets them: bf16 activations, ring
    and C, head_dim 64 and d_state 128 at unit inner strides, the ring L + T padded to 32, rows of ``tokens`` query
    tokens; ``read`` the checkpoint's type ("*fp32", or "*bf16": the split copy), ``stages`` its tensor-core reads
    (0: CUDA cores), ``ring`` the ring's product there too, ``pdl`` the programmatic dependent launch (on a GPU,
    with its grid-dependency wait), ``heads`` the heads each program walks and ``tma`` the checkpoint's tiles copied
    through a tensor descriptor."""
    from replayssm_patch.kernels.state_products import DOT_EXTENT

    consts = {"HAS_D": True, "BLOCK_T": tokens, "BLOCK_L": 32, "BLOCK_P": block_p, "BLOCK_N": block_n,
              "N_TILES": 128 // block_n, "C_STRIDE": 128, "EVEN": True,
              "TILE_T": max(tokens, DOT_EXTENT) if stages else tokens, "MMA_STAGES": stages, "C_IN_TF32": True,
              "C_IN_BF16": True,
              "RING_MMA": ring, "RING_IN_TF32": True, "PDL": pdl, "GDC": pdl, "HEADS": heads, "TMA": tma,
              **_VERIFY_UNIT_STRIDES}  # fmt: skip
    element = read.removeprefix("*")
    descriptor = f"tensordesc<{element}[1, 1, {block_p}, {block_n}]>" if tma else read  # unread without TMA
    return {**_VERIFY_STEP_POINTERS, "read_ptr": read, "read_desc": descriptor}, consts


def variants() -> list[tuple[str, triton.JITFunction, dict[str, str], dict[str, object], int]]:
    """(label, kernel, pointer types, constexprs, num_warps) for the default launch of each variant."""
    from replayssm_patch.kernels.cursor_plan import (
        PLAN_BLOCK,
        _cursor_plan_kernel,
        _take_pending_kernel,
        _verify_plan_kernel,
    )
    from replayssm_patch.kernels.decode_fold import FOLD_BLOCK_N, FOLD_BLOCK_P, FOLD_NUM_WARPS, _decode_fold_kernel
    from replayssm_patch.kernels.flush import _flush_kernel
    from replayssm_patch.kernels.gdn_mixed_decode import MIXED_BLOCK_V, MIXED_NUM_WARPS, _gdn_mixed_decode_kernel
    from replayssm_patch.kernels.launch_config import DEFAULT
    from replayssm_patch.kernels.replay_decode import (
        COEF_NUM_WARPS,
        _replay_step_kernel,
        _ring_coefficients_kernel,
    )
    from replayssm_patch.kernels.verify import (
        VERIFY_COEF_NUM_WARPS,
        VERIFY_HEAD_CHUNK,
        _verify_coefficients_kernel,
        _verify_step_kernel,
    )

    coef = {"HEADS_PER_GROUP": 16, "HAS_DT_BIAS": True, "DT_SOFTPLUS": True, "BLOCK_L": 16, "BLOCK_N": 128}
    found = [("ring coefficients", _ring_coefficients_kernel, _COEF_POINTERS, {**coef, "HEAD_CHUNK": 16},
              COEF_NUM_WARPS)]  # fmt: skip
    for label, read in (("fp32 checkpoint", "*fp32"), ("split precision", "*bf16")):
        consts = {
            "HAS_D": True, "HAS_FLUSH": True,
            "BLOCK_L": 16, "BLOCK_P": DEFAULT.block_p, "BLOCK_N": DEFAULT.block_n, "N_TILES": 128 // DEFAULT.block_n,
            **_UNIT_STRIDES,
        }  # fmt: skip
        pointers = {**_STEP_POINTERS, "read_ptr": read}
        found.append((f"replay step, {label}", _replay_step_kernel, pointers, consts, DEFAULT.num_warps))
        fold = {"HAS_D": True, "HAS_COPY": read == "*bf16", "B_IN_TF32": True, "BLOCK_L": 16, "BLOCK_P": FOLD_BLOCK_P,
                "P_BLOCKS": 64 // FOLD_BLOCK_P, "BLOCK_N": FOLD_BLOCK_N, "N_TILES": 128 // FOLD_BLOCK_N,
                **_FOLD_UNIT_STRIDES}  # fmt: skip
        found.append((f"decode fold, {label}", _decode_fold_kernel, {**_FOLD_POINTERS, "copy_ptr": read}, fold,
                      FOLD_NUM_WARPS))  # fmt: skip
    # (copy, prefetch, listed, ring entries, d_state block, warps). ptxas (two-pass tf32 dots on a bf16 ring): 156 /
    # 156 registers, 196 / 238 with the prefetch (no spills); walking a list of rows: 208 (tf32x3: 148 / 180, 234 /
    # 242, 230); the verify's fold on 2 warps over d_state slices of 32 at the ring of 32: 151 / 156, where whole
    # d_state rows on 2 warps spill
    flushes = [*((copy, prefetch, listed, 16, 128, 4) for copy, prefetch, listed in
                 (*itertools.product((False, True), (False, True), (False,)), (False, True, True))),
               *((copy, True, True, 32, 32, 2) for copy in (False, True))]  # fmt: skip
    for copy, prefetch, listed, ring, block_n, warps in flushes:
        pointers = {**_FLUSH_POINTERS, "bf16_ptr": "*bf16" if copy else "*fp32"}
        consts = {"HAS_LIST": listed, "HAS_BF16": copy, "PREFETCH": prefetch, "BLOCK_L": ring, "BLOCK_P": 16,
                  "BLOCK_N": block_n, "P_BLOCKS": 4, "N_BLOCKS": 128 // block_n,
                  "B_IN_TF32": True}  # head_dim 64, d_state 128, a bf16 ring  # fmt: skip
        label = (f"flush, bf16 copy {copy}" + (", prefetch" if prefetch else "") + (", listed rows" if listed else "")
                 + (f", d_state by {block_n}, {warps} warps" if block_n < 128 else ""))  # fmt: skip
        found.append((label, _flush_kernel, pointers, consts, warps))
    plan_pointers = {"slot_ptr": "*i32", "positions_ptr": "*i32", "window_end_ptr": "*i32", "write_pos_ptr": "*i32",
                     "flush_ptr": "*i32"}  # fmt: skip
    list_pointers = {**plan_pointers, "flush_rows_ptr": "*i32", "flush_count_ptr": "*i32"}
    found.append(("cursor plan", _cursor_plan_kernel, list_pointers, {"HAS_LIST": True, "BLOCK": PLAN_BLOCK}, 4))
    verify_plan_pointers = {**plan_pointers, "qsl_ptr": "*i32", "accepted_ptr": "*i32", "pending_ptr": "*i32",
                            "fold_ptr": "*i32", "fold_rows_ptr": "*i32", "fold_count_ptr": "*i32"}  # fmt: skip
    found.append(("verify plan", _verify_plan_kernel, verify_plan_pointers, {"HAS_LIST": True, "BLOCK": PLAN_BLOCK},
                  4))  # fmt: skip
    take_pointers = {**plan_pointers, "has_state_ptr": "*i1", "accepted_ptr": "*i32", "pending_ptr": "*i32",
                     "out_ptr": "*i32"}  # fmt: skip
    take_flags = {"HAS_STATE": True, "SPECULATIVE": True, "HAS_ACCEPTED": True, "STAGGER": True, "BLOCK": PLAN_BLOCK}
    found.append(("take pending", _take_pending_kernel, take_pointers, take_flags, 4))  # every branch compiled
    # MTP k = 3 (T = 4) on the L = 16 ring plus T: BLOCK_L 32
    verify_coef = {**coef, "BLOCK_T": 4, "BLOCK_L": 32, "HEAD_CHUNK": VERIFY_HEAD_CHUNK}
    for pdl in (False, True):  # before a programmatic dependent output launch: lets it start, writes no fp32 C
        consts = {**verify_coef, "PDL": pdl, "GDC": pdl}
        found.append((f"verify coefficients, T=4{', pdl' if pdl else ''}", _verify_coefficients_kernel,
                      _VERIFY_COEF_POINTERS, consts, VERIFY_COEF_NUM_WARPS))  # fmt: skip
    for warps in (4, 8):  # the kernel bench's widest coefficient shapes: a Nemotron group's 16 heads in one program
        wide = {**verify_coef, "HEAD_CHUNK": 16, "PDL": False, "GDC": False}
        found.append((f"verify coefficients, T=4, 16 heads x {warps} warps", _verify_coefficients_kernel,
                      _VERIFY_COEF_POINTERS, wide, warps))  # fmt: skip
    verify_launches = (  # the CUDA-core sums at the default shape; the tensor-core form at 64 x 32 x 4 warps, 3
        # stages (wgmma), with the ring's product there too at session 23's winner, 32 x 32 x 1 warp, 3 stages, and
        # that winner as a programmatic dependent launch
        ("", DEFAULT.block_p, DEFAULT.block_n, DEFAULT.num_warps, 0, False, False, 1, False),
        (", tensor cores", 64, 32, 4, 3, False, False, 1, False),
        (", tensor cores with the ring", 32, 32, 1, 3, True, False, 1, False),
        (", tensor cores, pdl", 32, 32, 1, 3, False, True, 1, False),
        # programs that walk 4 heads of a group in one pipelined loop (the kernel bench's widest such shape), and the
        # checkpoint's tiles copied by the tensor memory accelerator at session 23's winning tile
        (", tensor cores, 4 heads a program", 64, 64, 2, 3, False, False, 4, False),
        (", tensor cores, tma", 32, 32, 1, 3, False, False, 1, True),
    )  # fmt: skip
    for (label, read), (form, block_p, block_n, num_warps, stages, ring, pdl, heads, tma) in itertools.product(
        (("fp32 checkpoint", "*fp32"), ("split precision", "*bf16")), verify_launches
    ):
        pointers, consts = verify_step_launch(read, 4, block_p, block_n, stages, ring, pdl, heads, tma)
        found.append((f"verify step T=4, {label}{form}", _verify_step_kernel, pointers, consts, num_warps))
    found += gdn_variants(split=False) + gdn_variants(split=True)
    for split in (False, True):
        mixed = {**_GDN_BLOCKS, "V_PER_K": 2, "WIDTH": 4, "BLOCK_W": 4, "HAS_BIAS": False, "SILU": True,
                 "BLOCK_V": MIXED_BLOCK_V, "V_BLOCKS": 128 // MIXED_BLOCK_V, "SPLIT": split,
                 **_unit_strides(_gdn_mixed_decode_kernel, _GDN_UNIT_STRIDES)}  # fmt: skip
        label = "gdn mixed-step decode" + (", split precision" if split else "")
        found.append((label, _gdn_mixed_decode_kernel, _GDN_MIXED_POINTERS, mixed, MIXED_NUM_WARPS))
    return found


def gdn_variants(split: bool) -> list[tuple[str, triton.JITFunction, dict[str, str], dict[str, object], int]]:
    """The GDN decode step's launches (coefficients, the replay on the CUDA cores and on the tensor cores, the fold)
    and the materialise fold, at their defaults, with or without split precision."""
    from replayssm_patch.kernels.gdn_coefficients import COEF_NUM_WARPS, _gdn_coefficients_kernel
    from replayssm_patch.kernels.gdn_flush import _gdn_flush_kernel
    from replayssm_patch.kernels.gdn_fold import _gdn_fold_kernel
    from replayssm_patch.kernels.launch_config import GDN_DEFAULT

    found = []
    for label, kernel, pointers, blocks, num_warps in (
        ("gdn coefficients", _gdn_coefficients_kernel, _GDN_COEF_POINTERS, {"V_PER_K": 2, "HEAD_CHUNK": 2},
         COEF_NUM_WARPS),
        ("gdn fold", _gdn_fold_kernel, _GDN_FOLD_POINTERS,
         {"BLOCK_V": GDN_DEFAULT.fold_block_v, "V_BLOCKS": 128 // GDN_DEFAULT.fold_block_v},
         GDN_DEFAULT.fold_num_warps),
        ("gdn flush", _gdn_flush_kernel, _GDN_FLUSH_POINTERS, {"BLOCK_V": 16}, 4),
    ):  # fmt: skip
        consts = {**_GDN_BLOCKS, **blocks, "SPLIT": split, **_unit_strides(kernel, _GDN_UNIT_STRIDES)}
        found.append((label + (", split precision" if split else ""), kernel, pointers, consts, num_warps))
    replay = gdn_replay_variant(GDN_DEFAULT.replay_block_v, GDN_DEFAULT.replay_num_warps, split=split)
    # and its checkpoint products on the tensor cores at the Mamba-2 verify's winning tile, 32 x 32 x 1 warp, 3 stages
    found[1:1] = [replay, gdn_replay_variant(32, 1, 3, split=split)]  # between coefficients and fold
    if split:  # split precision's fold below tl.dot's 16 rows: the smallest program its sweep times
        consts = {**_GDN_BLOCKS, "BLOCK_V": 8, "V_BLOCKS": 16, "SPLIT": True,
                  **_unit_strides(_gdn_fold_kernel, _GDN_UNIT_STRIDES)}  # fmt: skip
        found.append(("gdn fold, split precision, 8 rows x 1 warp", _gdn_fold_kernel, _GDN_FOLD_POINTERS, consts, 1))
    return found


def gdn_replay_variant(
    block_v: int, num_warps: int, mma_stages: int = 0, split: bool = False
) -> tuple[str, triton.JITFunction, dict[str, str], dict[str, object], int]:
    """The GDN replay launch at one launch shape (Qwen3.5 block sizes; ``mma_stages`` > 0: its checkpoint products on
    the tensor cores), as ``variants`` lists it; the GDN kernel bench compiles its sweep's shapes with this to keep
    only those that do not spill."""
    from replayssm_patch.kernels.gdn_decode import MMA_TILE_K, _gdn_replay_kernel
    from replayssm_patch.kernels.state_products import DOT_EXTENT

    consts = {**_GDN_BLOCKS, "BLOCK_V": block_v, "EVEN": True, "MMA_STAGES": mma_stages, "TILE_K": MMA_TILE_K,
              "TILE_T": DOT_EXTENT, "SPLIT": split, **_unit_strides(_gdn_replay_kernel, _GDN_UNIT_STRIDES)}  # fmt: skip
    label = "gdn replay" + (", tensor cores" if mma_stages else "") + (", split precision" if split else "")
    pointers = {**_GDN_REPLAY_POINTERS, "state_ptr": "*bf16" if split else "*fp32"}  # split: it reads the copy
    return label, _gdn_replay_kernel, pointers, consts, num_warps


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("error: unset TRITON_INTERPRET; the compile check needs Triton's real compiler")
        return 2
    failed = 0
    for label, kernel, pointers, consts, num_warps in variants():
        try:
            done = compile_for_hopper(kernel, pointers, consts, num_warps)
            print(
                f"{label}: ok, {num_warps} warp(s), {done.registers} registers, {done.spill_bytes} B spilled, "
                f"cubin {done.cubin_bytes} bytes",
                flush=True,
            )
        except Exception as exc:  # report every variant, then fail
            failed += 1
            print(f"{label}: FAILED {type(exc).__name__}: {exc}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
