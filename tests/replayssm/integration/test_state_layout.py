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


@pytest.mark.parametrize("dim_first", [False, True])
def test_nemotron_h_8b_speculative_checkpoints_can_be_copied_by_the_tensor_memory_accelerator(dim_first):
    """The verify's TMA form reads the fp32 checkpoint and the bf16 copy where vLLM packs them, back to back in each
    block's page (here a page of exactly their bytes, vLLM's least): Nemotron-H-8B under MTP k = 3 with the ring of
    28, at the tiles the kernel bench sweeps, each view gets a descriptor (16-byte-aligned base and strides)."""
    from types import SimpleNamespace

    from replayssm_patch.gpu.layer_check import paged_state_tensors
    from replayssm_patch.kernels.verify import checkpoint_descriptor

    config = ReplaySSMConfig(enable=True, buffer_len=28, split_precision=True)
    conv, ssm = _stock(*DIMS[0], dim_first=dim_first)
    widened = (conv[0], conv[1] + 3) if dim_first else (conv[0] + 3, conv[1])  # vLLM widens it by k under speculation
    shapes = replay_state_shapes((widened, ssm), config, dim_first, verify_len=4)
    dtypes = replay_state_dtypes((torch.bfloat16, torch.float32), torch.bfloat16, config)
    page = sum(torch.Size(shape).numel() * dtype.itemsize for shape, dtype in zip(shapes, dtypes, strict=True))
    tensors = paged_state_tensors(SimpleNamespace(shapes=shapes, dtypes=dtypes, page_size_bytes=page), 2)
    for view in (tensors[1], tensors[STATE_BF16]):
        for block in ((32, 32), (64, 32), (64, 64), (32, 128)):
            descriptor = checkpoint_descriptor(view, *block)
            assert descriptor.block_shape == [1, 1, *block] and descriptor.strides[0] * view.element_size() == page
