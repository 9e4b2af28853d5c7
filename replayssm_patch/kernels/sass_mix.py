"""The speculative verify's instruction mix against T, from the sm_90a machine code, without a GPU.

    python -m replayssm_patch.kernels.sass_mix        # a Markdown table: instructions per program by form and T

Why: on the H200 the verify's output launch reads its checkpoint at 99 % of HBM with one token a row and at 74 % with
four (session 24, batch 256), at the same bytes: the work per query token is the cost. This counts the instructions
where the GPU cannot be had: each form compiled as the engine launches it (bf16 activations and ring, C exact in
tf32, the committed H200 shape), disassembled with Triton's bundled nvdisasm, per T. The counts are of the machine
code (the d_state loop's body once), not of what runs, and fewer is not faster by itself: uncapped, the form with
the ring's product on the tensor cores issues 11 % fewer at T = 4 and ran as fast, at 138 registers against 128. A
form worth the GPU's time issues fewer here at the same registers and no spills.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import triton

from replayssm_patch.kernels.compile_check import hopper_kernel, ptxas_usage, verify_step_launch

NVDISASM = Path(os.path.dirname(triton.__file__)) / "backends" / "nvidia" / "bin" / "nvdisasm"
TOKENS = (1, 2, 4, 8)
# the opcodes the table shows beside the total: the per-token sums' cross-lane reductions, the tensor-core products,
# global loads and stores, and the layout conversions through shared memory
SHOWN = ("SHFL", "HMMA", "FFMA", "FADD", "LDG", "STG", "LDS", "STS", "BAR")
_OPCODE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


@dataclass(frozen=True)
class VerifyForm:
    """A launch of the verify's output kernel: the committed H200 tile and register cap, its checkpoint reads on the
    tensor cores ``stages`` deep, the ring's product there too or not, and as a programmatic dependent launch (the
    model's C, the grid-dependency wait) or not."""

    label: str
    checkpoint: str  # "*fp32" or "*bf16" (split precision)
    ring_mma: bool
    block_p: int = 32
    block_n: int = 32
    num_warps: int = 1
    maxnreg: int = 112
    stages: int = 3
    pdl: bool = False


FORMS = (
    VerifyForm("fp32, CUDA-core ring sums (committed)", "*fp32", False),
    VerifyForm("fp32, ring on the tensor cores", "*fp32", True),
    VerifyForm("split, CUDA-core ring sums (committed)", "*bf16", False),
    VerifyForm("split, ring on the tensor cores", "*bf16", True),
    VerifyForm("fp32, programmatic dependent launch", "*fp32", False, pdl=True),
    VerifyForm("split, programmatic dependent launch", "*bf16", False, pdl=True),
)


def instruction_mix(cubin: bytes) -> Counter[str]:
    """Opcode counts of a cubin's machine code (every function, predicated ones included, modifiers dropped)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        listing = subprocess.run([str(NVDISASM), "-c", str(path)], capture_output=True, text=True, check=True).stdout
    return Counter(match.group(1) for line in listing.splitlines() if (match := _OPCODE.match(line)))


@dataclass(frozen=True)
class FormCount:
    """One form at one T: instructions per program, registers per thread, spilled bytes, the mix."""

    form: VerifyForm
    tokens: int
    instructions: int
    registers: int
    spill_bytes: int
    mix: Counter[str]


def count_form(form: VerifyForm, tokens: int) -> FormCount:
    """Compile ``form`` for rows of ``tokens`` query tokens (the ring L + T padded to 32) and count its machine code."""
    from replayssm_patch.kernels.verify import _verify_step_kernel

    pointers, consts = verify_step_launch(
        form.checkpoint, tokens, form.block_p, form.block_n, form.stages, form.ring_mma, form.pdl
    )
    compiled = hopper_kernel(_verify_step_kernel, pointers, consts, form.num_warps, form.maxnreg)
    mix = instruction_mix(compiled.asm["cubin"])
    registers, spills = ptxas_usage(compiled.asm["ptx"])
    return FormCount(form, tokens, sum(mix.values()), registers, spills, mix)


def markdown(counts: list[FormCount]) -> str:
    head = ["form", "T", "instructions", "registers", "spilled B", *SHOWN]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in counts:
        cells = [c.form.label, str(c.tokens), f"{c.instructions:,}", str(c.registers), str(c.spill_bytes)]
        lines.append("| " + " | ".join(cells + [str(c.mix[op]) for op in SHOWN]) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("error: unset TRITON_INTERPRET; the instruction mix needs Triton's real compiler")
        return 2
    print(markdown([count_form(form, tokens) for form in FORMS for tokens in TOKENS]), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
