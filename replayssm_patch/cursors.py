"""Per-block ring cursors: how many ring entries each sequence's state slot holds, and when its window flushes.

Why a table on the device: under CUDA graphs the decode step replays captured kernels, so the write
position and flush length of every row must sit in GPU buffers the graph reads. The metadata builder
calls these methods before each step (outside the graph) with the step's state indices; the table is
indexed by vLLM block id (one block per sequence in mamba_cache_mode 'none'). Block 0 is vLLM's null
block, used for padded rows: its cursor never moves. On CUDA a decode step's plan, and the take before a
prefill, are one launch each (``kernels.cursor_plan``); elsewhere their PyTorch twins run (the CPU vLLM tests).

Staggered windows: a sequence's first window after a prefill ends at L-1 - (hash(slot) mod L) and later ones at
L-1, so a cohort admitted in one step (consecutive slots) spreads its flushes over L steps instead of
folding every ring in the same step.

Speculative decoding (``verify_len`` = 1 + num_speculative_tokens > 0): each block also counts the entries its last
verify appended (``pending``). A verify step first commits the accepted prefix of those (positions += accepted,
from vLLM's num_accepted_tokens on the device), then appends its T tokens at the committed count; the rest of the
last verify's entries are overwritten (rollback is a cursor move). The ring holds buffer_len + verify_len entries,
and a row whose history would overflow it folds first (``verify_step``).
"""

from __future__ import annotations

import torch

NULL_BLOCK_ID = 0  # vLLM 0.24: vllm.v1.attention.backends.utils.NULL_BLOCK_ID, pads CUDA-graph rows


def first_window_end(slots: torch.Tensor, buffer_len: int, stagger: bool) -> torch.Tensor:
    """Write position at which a fresh sequence in ``slots`` flushes first: L-1 - (a hash of the slot mod L), or
    L-1. Hashed, not slot mod L: vLLM may hand a cohort block ids in steps of L (one block per KV-cache group
    each), which slot mod L would align again."""
    offset = (slots.long() * 2654435761 % 2**32) >> 16 if stagger else torch.zeros_like(slots.long())
    return (buffer_len - 1 - offset % buffer_len).to(torch.int32)


class CursorTable:
    """Entry count of every block's ring (0..buffer_len-1; committed entries under speculation) and the write
    position its window flushes at; with ``verify_len`` > 0 also the entries each block's last verify appended."""

    def __init__(
        self, num_blocks: int, buffer_len: int, device: torch.device | str, stagger: bool = True, verify_len: int = 0
    ) -> None:
        self.buffer_len = buffer_len
        self.stagger = stagger
        self.verify_len = verify_len
        self.positions = torch.zeros(num_blocks, dtype=torch.int32, device=device)
        self.window_end = first_window_end(torch.arange(num_blocks, device=device), buffer_len, stagger)
        # imported here, not at module level, and chosen once: one launch on CUDA, the PyTorch twins elsewhere
        from replayssm_patch.kernels import cursor_plan as plans

        kernels = plans.plan_decode_rows, plans.plan_verify_rows, plans.plan_take_pending
        twins = plans.plan_decode_rows_reference, plans.plan_verify_rows_reference, plans.plan_take_pending_reference
        self._plan_decode, self._plan_verify, self._take_pending = (
            kernels if self.positions.device.type == "cuda" else twins
        )
        self.pending = torch.zeros(num_blocks, dtype=torch.int32, device=device) if verify_len else None

    def decode_step(
        self,
        slots: torch.Tensor,
        write_pos: torch.Tensor,
        flush_len: torch.Tensor,
        real_rows: int | None = None,
        flush_rows: torch.Tensor | None = None,
        flush_count: torch.Tensor | None = None,
    ) -> None:
        """Plan one decode step and advance the cursors of rows [0, real_rows) of ``slots`` (default: all).

        Fills ``write_pos`` (the ring position this token is written to) and ``flush_len`` (write_pos + 1 on
        the step that ends the row's window, else 0) in place, so callers can pass persistent buffers; rows
        past real_rows (graph padding) and null-block rows get 0. ``flush_rows`` / ``flush_count``, when given,
        receive the list of flush rows the decode step's fold walks.
        """
        if real_rows is None:
            real_rows = slots.shape[0]
        self._plan_decode(
            slots, self.positions, self.window_end, write_pos, flush_len, real_rows, self.buffer_len, NULL_BLOCK_ID,
            flush_rows, flush_count,
        )  # fmt: skip

    def verify_step(
        self,
        slots: torch.Tensor,
        query_start_loc: torch.Tensor,
        num_accepted: torch.Tensor,
        write_pos: torch.Tensor,
        fold_len: torch.Tensor,
        real_rows: int | None = None,
        fold_rows: torch.Tensor | None = None,
        fold_count: torch.Tensor | None = None,
    ) -> None:
        """Plan one verify step of rows [0, real_rows) (``kernels.cursor_plan.plan_verify_rows``): commit the accepted
        prefix of each row's last verify, fill ``write_pos`` / ``fold_len`` in place (fold_len > 0: fold that many
        committed entries first, then append at 0) and record this step's T_r = query_start_loc[r+1] -
        query_start_loc[r] as pending. ``fold_rows`` / ``fold_count``, when given, receive the list of folding rows
        the verify's fold walks. Device ops only; never call it for a CUDA-graph capture (a dry run)."""
        assert self.pending is not None, "verify_step needs a table built with verify_len > 0"
        if real_rows is None:
            real_rows = slots.shape[0]
        self._plan_verify(
            slots, query_start_loc, num_accepted, self.positions, self.pending, self.window_end, write_pos, fold_len,
            real_rows, self.buffer_len, self.verify_len, NULL_BLOCK_ID, fold_rows, fold_count,
        )  # fmt: skip

    def flush_at_next_replay(self, slots: torch.Tensor) -> None:
        """End the window of ``slots`` at their next ring position: their next replay-regime step folds and answers
        from the fp32 master, which rewrites the bf16 copy. Split precision after a native step, whose vLLM path
        wrote the master only. One launch, no sync; null-block rows never flush, so padding may be passed."""
        self.window_end.index_fill_(0, slots.long(), 0)

    def take_pending(
        self, slots: torch.Tensor, has_state: torch.Tensor | None = None, num_accepted: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Ring entries to fold into the checkpoint before a prefill step; restarts those rings (at 0, with a
        staggered first window).

        ``has_state`` marks rows that continue a sequence (vLLM's has_initial_states); a fresh
        sequence in a reused slot gets 0 so the previous owner's ring is never read. Under speculation
        ``num_accepted`` (the rows' vLLM counts) commits the accepted prefix of a row's last verify first.
        """
        return self._take_pending(
            slots, has_state, num_accepted, self.positions, self.pending, self.window_end, self.buffer_len,
            self.stagger, NULL_BLOCK_ID,
        )  # fmt: skip
