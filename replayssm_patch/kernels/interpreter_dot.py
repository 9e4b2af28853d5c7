"""Triton's interpreter multiplying bf16 operands by value in ``tl.dot``, so the split copy's reads run on a CPU.

Triton 3.6's interpreter keeps bf16 tensors as their uint16 bits and ``tl.dot`` multiplies those bits, where the GPU
multiplies the values (upstream: bf16 dots are not supported there yet, triton-lang/triton#11584). The split copy's
checkpoint reads are bf16 products (``state_products.checkpoint_reads_mma``), so under ``TRITON_INTERPRET=1``
(the CPU tests, the benches' smoke mode) that module has the interpreter's dot take the operands' values: bf16 bits
shifted left 16 are the same number as an fp32, exactly. Nothing changes on a GPU or for other dtypes.
"""

from __future__ import annotations

import functools

import numpy as np
import triton.language as tl


@functools.cache  # once per process: wrapping the wrapper would convert twice
def bf16_dots_by_value() -> None:
    """Wrap the interpreter's dot builder so bf16 operands enter it as their fp32 values."""
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    create_dot = InterpreterBuilder.create_dot

    def as_value(operand: TensorHandle) -> TensorHandle:
        if operand.dtype.scalar != tl.bfloat16:
            return operand
        return TensorHandle((operand.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def create_dot_by_value(self, a, b, d, input_precision, max_num_imprecise_acc):
        return create_dot(self, as_value(a), as_value(b), d, input_precision, max_num_imprecise_acc)

    InterpreterBuilder.create_dot = create_dot_by_value
