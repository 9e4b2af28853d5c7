"""Per-block ring cursors: how many ring entries each sequence's state slot holds (pure torch, CPU-testable).

Why a table on the device: under CUDA graphs the decode step replays captured kernels, so the write
position and flush length of every row must sit in GPU buffers the graph reads. The metadata builder
calls these functions before each step (outside the graph) with the step's state indices; the table is
indexed by vLLM block id (one block per sequence in mamba_cache_mode 'none'). Block 0 is vLLM's null
block, used for padded rows: its cursor never moves.
"""

from __future__ import annotations

import torch

NULL_BLOCK_ID = 0  # vLLM 0.24: vllm.v1.attention.backends.utils.NULL_BLOCK_ID, pads CUDA-graph rows


class CursorTable:
    """Entry count of every block's ring (0..buffer_len-1; a full ring is flushed in the same step)."""

    def __init__(self, num_blocks: int, buffer_len: int, device: torch.device | str) -> None:
        self.buffer_len = buffer_len
        self.positions = torch.zeros(num_blocks, dtype=torch.int32, device=device)

    def decode_step(self, slots: torch.Tensor, write_pos: torch.Tensor, flush_len: torch.Tensor) -> None:
        """Plan one decode step for ``slots`` (real rows only) and advance their cursors.

        Fills ``write_pos`` (the ring position this token is written to) and ``flush_len`` (buffer_len
        on the step that fills the ring, else 0) in place, so callers can pass persistent buffers.
        """
        slots = slots.long()
        real = slots != NULL_BLOCK_ID
        pos = torch.where(real, self.positions[slots], 0)
        write_pos.copy_(pos)
        flush_len.copy_(torch.where(real & (pos == self.buffer_len - 1), self.buffer_len, 0))
        advanced = torch.where(real, (pos + 1) % self.buffer_len, self.positions[slots])
        self.positions.index_put_((slots,), advanced.to(torch.int32))

    def take_pending(self, slots: torch.Tensor, has_state: torch.Tensor | None = None) -> torch.Tensor:
        """Ring entries to fold into the checkpoint before a prefill step; resets those cursors to 0.

        ``has_state`` marks rows that continue a sequence (vLLM's has_initial_states); a fresh
        sequence in a reused slot gets 0 so the previous owner's ring is never read.
        """
        slots = slots.long()
        real = slots != NULL_BLOCK_ID
        if has_state is not None:
            real = real & has_state
        pending = torch.where(real, self.positions[slots], 0).to(torch.int32)
        reset = torch.where(slots != NULL_BLOCK_ID, 0, self.positions[slots])
        self.positions.index_put_((slots,), reset.to(torch.int32))
        return pending
