"""``plan_take_pending`` (Triton, under TRITON_INTERPRET=1) vs its PyTorch twin, the body ``CursorTable.take_pending``
runs on CPU: the same returned entries and the same table afterwards, to the integer, for every launch variant."""

from __future__ import annotations

import pytest
import torch

from replayssm_patch.cursors import NULL_BLOCK_ID, CursorTable, first_window_end
from replayssm_patch.kernels.cursor_plan import PLAN_BLOCK, plan_take_pending, plan_take_pending_reference
from tests.replayssm.kernels.numerics import seeded

T = 3  # verify_len of the speculative tables


def random_table(blocks: int, buffer_len: int, stagger: bool, verify_len: int, gen: torch.Generator) -> CursorTable:
    """A table in the middle of decoding: cursors, window ends and (speculation) pending counts drawn at random."""
    table = CursorTable(blocks, buffer_len, "cpu", stagger=stagger, verify_len=verify_len)
    table.positions.copy_(torch.randint(0, buffer_len + verify_len, (blocks,), generator=gen, dtype=torch.int32))
    table.window_end.copy_(torch.randint(0, buffer_len, (blocks,), generator=gen, dtype=torch.int32))
    if table.pending is not None:
        table.pending.copy_(torch.randint(0, verify_len + 1, (blocks,), generator=gen, dtype=torch.int32))
    return table


def take_both(table: CursorTable, slots: torch.Tensor, has_state, num_accepted) -> list[tuple[list, ...]]:
    """Run the kernel and the twin on copies of ``table``: (returned, positions, window_end, pending) of each."""
    seen = []
    for plan in (plan_take_pending, plan_take_pending_reference):
        positions, window_end = table.positions.clone(), table.window_end.clone()
        pending = None if table.pending is None else table.pending.clone()
        taken = plan(slots, has_state, num_accepted, positions, pending, window_end, table.buffer_len, table.stagger,
                     NULL_BLOCK_ID)  # fmt: skip
        assert taken.dtype == torch.int32 and taken.shape == slots.shape
        seen.append((taken.tolist(), positions.tolist(), window_end.tolist(), None if pending is None else
                     pending.tolist()))  # fmt: skip
    return seen


@pytest.mark.parametrize("rows", [0, 7, PLAN_BLOCK + 9], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("speculation", ["off", "accepted-none", "accepted-given"])
@pytest.mark.parametrize("has_state", [False, True], ids=["state-none", "state-mask"])
@pytest.mark.parametrize("stagger", [True, False], ids=["stagger", "aligned"])
@pytest.mark.parametrize("buffer_len", [16, 4], ids=lambda n: f"L{n}")
def test_take_pending_kernel_matches_its_reference(
    rows: int, speculation: str, has_state: bool, stagger: bool, buffer_len: int
) -> None:
    """Unique random slots with null-block rows mixed in (every 4th row), as vLLM's strided state indices (column 0 of
    [rows, 2]); a has_initial_states mask or none; under speculation num_accepted absent or a slice of the whole
    batch's counts, negative values among them (they clamp to 0). More rows than PLAN_BLOCK take two programs."""
    gen = seeded("take-pending", rows, speculation, has_state, stagger, buffer_len)
    blocks = 2 * rows + 8
    table = random_table(blocks, buffer_len, stagger, 0 if speculation == "off" else T, gen)
    indices = torch.zeros(rows, 2, dtype=torch.int32)
    indices[:, 0] = torch.randperm(blocks - 1, generator=gen)[:rows].to(torch.int32) + 1
    indices[1::4, 0] = NULL_BLOCK_ID
    slots = indices[:, 0]
    state = torch.rand(rows, generator=gen) < 0.6 if has_state else None
    accepted = None
    if speculation == "accepted-given":
        accepted = torch.randint(-3, T + 3, (rows + 5,), generator=gen, dtype=torch.int32)[2 : 2 + rows]
    kernel, reference = take_both(table, slots, state, accepted)
    assert kernel == reference
    if rows:  # the draw covers what the comparison is about
        assert any(kernel[0]), "some rows take entries"
        assert accepted is None or (accepted < 0).any()
    else:
        assert kernel[1:] == (table.positions.tolist(), table.window_end.tolist(),
                              None if table.pending is None else table.pending.tolist())  # fmt: skip


def test_take_pending_kernel_hashes_large_block_ids_as_first_window_end() -> None:
    """The first window's end of block ids up to 2**20 (slot * 2654435761 passes 2**32 for every slot > 1): the
    kernel's int64 hash equals ``cursors.first_window_end`` bit for bit."""
    gen = seeded("take-pending-hash")
    blocks = 1 << 20
    slots = torch.randperm(blocks - 1, generator=gen)[:600].to(torch.int32) + 1
    for buffer_len in (16, 4):
        table = CursorTable(blocks, buffer_len, "cpu", stagger=True)
        plan_take_pending(slots, None, None, table.positions, None, table.window_end, buffer_len, True, NULL_BLOCK_ID)
        assert torch.equal(table.window_end[slots.long()], first_window_end(slots, buffer_len, stagger=True))
