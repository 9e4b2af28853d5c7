"""The KV-cache layout the plugin declares matches the kernels' layout (shapes, dtypes, bytes, alignment).

``replayssm_patch.kernels`` is imported inside the tests, not at collection: tests/replayssm/kernels/conftest.py
must be the first to import it (it imports the kernels in Triton's interpreter mode).
"""

import pytest
import torch

from replayssm_patch.config import ReplaySSMConfig
from replayssm_patch.state_layout import (
    RING_B,
    RING_DT,
    RING_X,
    STATE_BF16,
    Mamba2Dims,
    replay_state_dtypes,
    replay_state_shapes,
)

# (nheads, head_dim, ngroups, d_state, conv_kernel): Nemotron-H-8B, a TP=2 shard of it, a small model
DIMS = [(128, 64, 8, 128, 4), (64, 64, 4, 128, 4), (24, 16, 1, 64, 4)]


def _stock(nheads, head_dim, ngroups, d_state, conv_kernel, dim_first):
    conv_dim = nheads * head_dim + 2 * ngroups * d_state
    conv = (conv_dim, conv_kernel - 1) if dim_first else (conv_kernel - 1, conv_dim)
    return conv, (nheads, head_dim, d_state)


@pytest.mark.parametrize("dims", DIMS)
@pytest.mark.parametrize("dim_first", [False, True])
@pytest.mark.parametrize("split", [False, True])
def test_extra_tensors_are_the_kernel_layout(dims, dim_first, split):
    from replayssm_patch.kernels import ring_shapes

    nheads, head_dim, ngroups, d_state, _ = dims
    config = ReplaySSMConfig(enable=True, buffer_len=16, split_precision=split)
    stock = _stock(*dims, dim_first=dim_first)
    shapes = replay_state_shapes(stock, config, dim_first)
    kernel = ring_shapes(nheads, head_dim, ngroups, d_state, 16, split)
    assert shapes[:2] == stock
    assert shapes[RING_DT] == kernel.ring_dt and shapes[RING_X] == kernel.ring_x and shapes[RING_B] == kernel.ring_B
    assert (shapes[STATE_BF16] if split else None) == kernel.state_bf16
    assert len(shapes) == (6 if split else 5)


@pytest.mark.parametrize("split", [False, True])
def test_extra_bytes_match_the_kernels_and_offsets_stay_aligned(split):
    from replayssm_patch.kernels import ring_shapes

    config = ReplaySSMConfig(enable=True, buffer_len=16, split_precision=split)
    stock = _stock(*DIMS[0], dim_first=False)
    shapes = replay_state_shapes(stock, config, False)
    dtypes = replay_state_dtypes((torch.bfloat16, torch.float32), torch.bfloat16, config)
    sizes = [torch.Size(s).numel() * d.itemsize for s, d in zip(shapes, dtypes, strict=True)]
    assert sum(sizes[2:]) == ring_shapes(128, 64, 8, 128, 16, split).nbytes(torch.bfloat16)
    offset = 0
    for size, dtype in zip(sizes, dtypes, strict=True):  # vLLM packs the tensors back to back in the page
        assert offset % dtype.itemsize == 0
        offset += size


def test_dims_reject_a_conv_state_that_does_not_fit():
    with pytest.raises(ValueError, match="does not fit"):
        Mamba2Dims.from_state_shapes((3, 8193), (128, 64, 128), dim_first=False)
