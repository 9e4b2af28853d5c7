"""The interpreter's ``tl.dot`` on bf16 operands, as ``kernels.interpreter_dot`` makes it (the split copy's reads)."""

import torch
import triton
import triton.language as tl

import replayssm_patch.kernels.state_products  # noqa: F401  (installs the bf16 dot by value under the interpreter)


def test_a_bf16_dot_multiplies_the_values_not_the_bits() -> None:
    """Small integers are exact in bf16, and so are their products' sums in fp32: the dot must equal torch's. Triton
    3.6's own interpreter gives ~1e10 here (it multiplies the uint16 bit patterns)."""

    @triton.jit
    def dot_kernel(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
        rows = tl.arange(0, N)
        at = rows[:, None] * N + rows[None, :]
        tl.store(c_ptr + at, tl.dot(tl.load(a_ptr + at), tl.load(b_ptr + at)))

    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randint(-3, 4, (16, 16), generator=gen).to(torch.bfloat16) for _ in range(2))
    c = torch.full((16, 16), float("nan"))
    dot_kernel[(1,)](a, b, c, N=16)
    assert torch.equal(c, a.float() @ b.float())
