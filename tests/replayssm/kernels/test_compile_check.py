"""The Hopper compile check, the instruction counts and the PTX of the kernels, from Triton's real compiler on CPU."""

from __future__ import annotations

import functools
import json

from tests.replayssm.kernels.processes import run_compiled, run_module


@functools.cache
def compile_check_lines() -> tuple[str, ...]:
    """The compile check's "ok" lines (one run shared by the tests below); fails the test if any variant failed."""
    done = run_module("replayssm_patch.kernels.compile_check", interpret=False)
    assert done.returncode == 0, done.stdout
    return tuple(line for line in done.stdout.splitlines() if ": ok" in line)


def test_kernels_compile_for_hopper() -> None:
    """The real Triton compiler (not the interpreter) accepts every default kernel variant for sm_90."""
    lines = compile_check_lines()
    # 13 decode-path and flush ones (2 of them the fold over d_state slices on 2 warps), the take before a prefill, 17
    # of the verify (2 of them its coefficient launch's widest swept shapes), 13 GDN (7 of them split precision)
    assert len(lines) == 44, lines
    registers = [int(line.split(" registers")[0].rsplit(" ", 1)[1]) for line in lines]
    assert all(0 < count <= 255 for count in registers), lines  # ptxas -v was read for every kernel
    every_step = [line for line in lines if line.startswith(("replay step", "decode fold", "ring coefficients"))]
    assert len(every_step) == 5 and all(" 0 B spilled" in line for line in every_step), lines
    flushes = [line for line in lines if line.startswith("flush, bf16 copy")]
    assert len(flushes) == 7 and all(" 0 B spilled" in line for line in flushes), lines
    assert sum("d_state by 32, 2 warps" in line for line in flushes) == 2, lines
    verify_steps = [line for line in lines if line.startswith("verify step")]  # both dtypes, the six forms
    assert len(verify_steps) == 12 and all(" 0 B spilled" in line for line in verify_steps), lines
    coefficients = [line for line in lines if line.startswith("verify coefficients")]  # 4 x 4 (+ pdl), 16 x 4 and 8
    assert len(coefficients) == 4 and all(" 0 B spilled" in line for line in coefficients), lines


_COUNT_VERIFY_FORMS = """
import json
from replayssm_patch.kernels.sass_mix import FORMS, count_form, markdown
sums, ring = FORMS[0], FORMS[1]
counts = [count_form(sums, 1), count_form(sums, 4), count_form(ring, 4)]
print(json.dumps({"rows": [[c.tokens, c.instructions, c.registers, c.spill_bytes, c.mix["SHFL"], c.mix["HMMA"]]
                           for c in counts], "table": markdown(counts)}))
"""


def test_the_verify_instruction_mix_counts_the_per_token_sums_and_their_tensor_core_form() -> None:
    """sm_90a machine code, no GPU (kernels/sass_mix.py): the committed form's ring sums add the same cross-lane
    shuffles for every query token; with the ring's product on the tensor cores there are none and more HMMA; both
    stay within the 112-register cap the committed table sets."""
    result = json.loads(run_compiled(_COUNT_VERIFY_FORMS).stdout)
    sums_1, sums_4, ring_4 = result["rows"]
    (t1, n1, r1, _, shfl1, hmma1), (t4, n4, r4, s4, shfl4, hmma4) = sums_1, sums_4
    _, n_ring, r_ring, _, shfl_ring, hmma_ring = ring_4
    assert (t1, t4) == (1, 4) and shfl1 > 0 and shfl4 == 4 * shfl1 and n4 > n1 and hmma4 == hmma1
    assert shfl_ring == 0 and hmma_ring > hmma4 and n_ring < n4
    assert max(r1, r4, r_ring) <= 112 and s4 == 0
    table = result["table"].splitlines()
    assert table[0].startswith("| form | T | instructions | registers | spilled B | SHFL | HMMA |") and len(table) == 5
    assert table[3].startswith(f"| fp32, CUDA-core ring sums (committed) | 4 | {n4:,} | {r4} | 0 | {shfl4} | {hmma4} |")


_GRID_DEPENDENCY_PTX = """
import json
from replayssm_patch.kernels.compile_check import hopper_kernel, variants
ptx = {label: hopper_kernel(kernel, pointers, consts, warps).asm["ptx"]
       for label, kernel, pointers, consts, warps in variants() if label.startswith("verify")}
print(json.dumps({label: [code.count("griddepcontrol.launch_dependents"), code.count("griddepcontrol.wait")]
                  for label, code in ptx.items()}))
"""


def test_only_the_programmatic_dependent_verify_carries_the_grid_dependency_instructions() -> None:
    """sm_90a PTX, no GPU: with ``pdl`` the coefficient launch lets the output launch start and the output launch
    waits once (before it reads the coefficients); without it neither instruction is there, so the committed
    launches are untouched."""
    counts = json.loads(run_compiled(_GRID_DEPENDENCY_PTX, timeout=600).stdout)
    assert counts["verify coefficients, T=4, pdl"] == [1, 0] and counts["verify coefficients, T=4"] == [0, 0]
    dependent = {label: found for label, found in counts.items() if label.startswith("verify step")}
    assert len(dependent) == 12
    for label, found in dependent.items():
        assert found == ([0, 1] if label.endswith(", pdl") else [0, 0]), (label, found)


_MISSING_CONSTEXPR = """
from replayssm_patch.kernels.compile_check import hopper_kernel, verify_step_launch
from replayssm_patch.kernels.verify import _verify_step_kernel
pointers, consts = verify_step_launch("*fp32", 4, 32, 32, 3, False)
del consts["GDC"]
try:
    hopper_kernel(_verify_step_kernel, pointers, consts, 1)
except ValueError as exc:
    print(exc)
"""


def test_a_compile_without_a_value_for_every_constexpr_is_refused() -> None:
    """A constexpr left out would compile as an i32 argument (both sides of its branches, other register counts)
    without an error: the compile check names it instead."""
    assert run_compiled(_MISSING_CONSTEXPR).stdout.strip() == "_verify_step_kernel: no value for the constexprs ['GDC']"


def test_gdn_decode_step_kernels_do_not_spill() -> None:
    """The three launches of every GDN decode step (coefficients, replay in both forms, fold) fit their registers on
    sm_90, with and without split precision (its fold also in 8-row, 1-warp programs), and so does the split
    materialise fold."""
    every_step = [line for line in compile_check_lines() if line.startswith(("gdn coefficients", "gdn replay",
                                                                             "gdn fold"))]  # fmt: skip
    assert len(every_step) == 9 and all(" 0 B spilled" in line for line in every_step), every_step
    assert sum("split precision" in line for line in every_step) == 5, every_step
    split_flush = [line for line in compile_check_lines() if line.startswith("gdn flush, split precision")]
    assert len(split_flush) == 1 and " 0 B spilled" in split_flush[0], split_flush


def test_gdn_mixed_step_kernel_does_not_spill() -> None:
    """The one launch of a mixed step's GDN decode rows (conv, coefficients, replay or fold) fits on sm_90, with and
    without split precision."""
    mixed = [line for line in compile_check_lines() if line.startswith("gdn mixed-step decode")]
    assert len(mixed) == 2 and all(" 0 B spilled" in line for line in mixed), mixed


def test_gdn_replay_sweep_keeps_only_shapes_that_do_not_spill() -> None:
    """The sweep asks the real compiler (sm_90 ptxas) for the replay's spills; today's default shape has none."""
    code = (
        "from replayssm_patch.gpu.gdn_bench_setup import Plan; "
        "from replayssm_patch.gpu.gdn_kernel_bench import replay_spills; print(replay_spills(Plan(), 32, 4))"
    )
    assert run_compiled(code, timeout=120).stdout.strip() == "0"
