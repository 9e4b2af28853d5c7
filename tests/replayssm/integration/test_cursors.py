"""Ring cursors: advance, flush at the window end, reset before prefill, null block untouched (torch on CPU)."""

import torch

from replayssm_patch.cursors import NULL_BLOCK_ID, CursorTable, first_window_end

L = 4


def _step(table, slots):
    slots = torch.tensor(slots, dtype=torch.int32)
    write_pos = torch.full_like(slots, -7)
    flush_len = torch.full_like(slots, -7)
    table.decode_step(slots, write_pos, flush_len)
    return write_pos.tolist(), flush_len.tolist()


def test_cursor_advances_and_flushes_on_the_step_that_fills_the_ring():
    table = CursorTable(num_blocks=8, buffer_len=L, device="cpu", stagger=False)
    seen = [_step(table, [3]) for _ in range(2 * L + 1)]
    assert [w[0] for w, _ in seen] == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    assert [f[0] for _, f in seen] == [0, 0, 0, L, 0, 0, 0, L, 0]


def test_rows_are_independent():
    table = CursorTable(num_blocks=8, buffer_len=L, device="cpu", stagger=False)
    _step(table, [1])
    _step(table, [1])
    write_pos, flush_len = _step(table, [5, 1])
    assert write_pos == [0, 2]
    assert flush_len == [0, 0]
    assert table.positions.tolist() == [0, 3, 0, 0, 0, 1, 0, 0]


def test_null_block_never_moves_and_gets_no_flush():
    table = CursorTable(num_blocks=4, buffer_len=L, device="cpu", stagger=False)
    for _ in range(L + 2):
        write_pos, flush_len = _step(table, [2, NULL_BLOCK_ID, NULL_BLOCK_ID])
        assert write_pos[1:] == [0, 0] and flush_len[1:] == [0, 0]
    assert table.positions[NULL_BLOCK_ID].item() == 0
    assert table.positions[2].item() == (L + 2) % L


def test_take_pending_returns_ring_counts_and_resets():
    table = CursorTable(num_blocks=8, buffer_len=L, device="cpu", stagger=False)
    for _ in range(3):
        _step(table, [2, 6])
    _step(table, [6])
    pending = table.take_pending(torch.tensor([2, 6], dtype=torch.int32))
    assert pending.tolist() == [3, 0]  # slot 6 flushed on its 4th step: ring empty
    assert table.positions[2].item() == 0 and table.positions[6].item() == 0
    assert _step(table, [2])[0] == [0]  # decode after the prefill starts a fresh ring


def test_fresh_sequence_in_a_reused_slot_reads_nothing_of_the_old_ring():
    table = CursorTable(num_blocks=8, buffer_len=L, device="cpu", stagger=False)
    _step(table, [4])
    _step(table, [4])
    has_state = torch.tensor([False, True])
    pending = table.take_pending(torch.tensor([4, NULL_BLOCK_ID], dtype=torch.int32), has_state)
    assert pending.tolist() == [0, 0]
    assert table.positions[4].item() == 0


def test_staggered_first_windows_spread_a_cohorts_flushes():
    """A cohort starting together flushes first at L-1 - hash(slot) mod L: a flush folds write_pos + 1 entries,
    later windows are L long, and no step folds more than a few of the rings (aligned: all of them at once)."""
    table = CursorTable(num_blocks=64, buffer_len=L, device="cpu")
    cohort = torch.arange(1, 33, dtype=torch.int32)
    table.take_pending(cohort)  # their prefills
    first = first_window_end(cohort, L, stagger=True)
    flushes = [_step(table, cohort.tolist())[1] for _ in range(3 * L)]
    for row, end in enumerate(first.tolist()):
        folded = [(t, f[row]) for t, f in enumerate(flushes) if f[row]]
        assert folded[0] == (end, end + 1)  # the first window: end + 1 entries
        assert [t for t, _ in folded[1:]] == [end + L * k for k in range(1, len(folded))]
        assert all(n == L for _, n in folded[1:])
    per_step = [sum(f > 0 for f in step) for step in flushes]
    assert max(per_step) <= 2 * len(cohort) // L and sum(per_step[:L]) == len(cohort)


def test_a_cohort_in_blocks_l_apart_is_still_spread():
    """vLLM can hand consecutive requests block ids L apart (one block per KV-cache group each); slot mod L would
    flush them all in one step, the hash does not."""
    ends = first_window_end(torch.arange(0, 16 * 64, 16), 16, stagger=True)
    assert ends.unique().numel() >= 12 and torch.bincount(ends.long()).max() <= 12
    assert (first_window_end(torch.arange(0, 64, 16), 16, stagger=False) == 15).all()


def test_graph_padding_rows_past_the_real_count_get_zero_and_move_nothing():
    table = CursorTable(num_blocks=8, buffer_len=L, device="cpu", stagger=False)
    write_pos = torch.full((4,), -7, dtype=torch.int32)
    flush_len = torch.full((4,), -7, dtype=torch.int32)
    for _ in range(L):
        table.decode_step(torch.tensor([5, 6, 6, 6], dtype=torch.int32), write_pos, flush_len, real_rows=1)
    assert write_pos.tolist() == [3, 0, 0, 0] and flush_len.tolist() == [4, 0, 0, 0]
    assert table.positions[6].item() == 0


T = 3  # verify rows of 1 + k = 3 tokens: the ring holds L + T = 7 entries


def _verify(table, slots, accepted, counts=None):
    """One verify step of ``slots`` (T tokens each unless ``counts``); accepted = vLLM's num_accepted_tokens."""
    slots = torch.tensor(slots, dtype=torch.int32)
    counts = torch.tensor(counts or [T] * len(slots), dtype=torch.int32)
    qsl = torch.cat([torch.zeros(1, dtype=torch.int32), counts.cumsum(0).to(torch.int32)])
    write_pos = torch.full_like(slots, -7)
    fold_len = torch.full_like(slots, -7)
    table.verify_step(slots, qsl, torch.tensor(accepted, dtype=torch.int32), write_pos, fold_len)
    return write_pos.tolist(), fold_len.tolist()


def _spec_table(**kw):
    return CursorTable(num_blocks=8, buffer_len=L, device="cpu", stagger=False, verify_len=T, **kw)


def test_verify_commits_the_accepted_prefix_and_overwrites_the_rejected_entries():
    table = _spec_table()
    assert _verify(table, [3], [1]) == ([0], [0])  # after the prefill: nothing pending, the forced 1 commits nothing
    assert _verify(table, [3], [2]) == ([2], [0])  # 2 of the 3 entries accepted: the third is overwritten now
    assert table.positions[3].item() == 2 and table.pending[3].item() == T


def test_all_rejected_advances_one_entry_per_verify():
    """num_accepted = 1 (only the corrected token): a rollback of every draft is a cursor move by one."""
    table = _spec_table()
    seen = [_verify(table, [5], [1]) for _ in range(L + 3)]
    assert [w[0] for w, _ in seen] == [0, 1, 2, 3, 4, 0, 1]  # history of 5 > L: folds before the 6th verify
    assert [f[0] for _, f in seen] == [0, 0, 0, 0, 0, 5, 0]


def test_all_accepted_folds_before_a_verify_would_overflow_the_ring():
    table = _spec_table()
    seen = [_verify(table, [2], [1 if t == 0 else T]) for t in range(5)]
    assert [w[0] for w, _ in seen] == [0, 3, 0, 3, 0]  # 6 committed + 3 would pass L + T = 7 entries
    assert [f[0] for _, f in seen] == [0, 0, 6, 0, 6]
    assert all(w[0] + T <= L + T for w, _ in seen)


def test_mixed_acceptance_and_token_counts_stay_inside_the_ring():
    """Rows with different drafts (an ngram row with none: 1 token) and acceptance; padding past real rows."""
    table = _spec_table()
    gen = torch.Generator().manual_seed(3)
    _verify(table, [1, 4], [1, 1])
    for _ in range(20):
        counts = torch.randint(1, T + 1, (2,), generator=gen).tolist()
        accepted = [int(torch.randint(1, c + 1, (1,), generator=gen)) for c in table.pending[[1, 4]].tolist()]
        write_pos, fold_len = _verify(table, [1, 4], accepted, counts)
        assert all(w + c <= L + T for w, c in zip(write_pos, counts, strict=True))
        assert all(f == 0 or w == 0 for w, f in zip(write_pos, fold_len, strict=True))


def test_verify_graph_padding_and_the_null_block_move_nothing():
    table = _spec_table()
    slots = torch.tensor([6, NULL_BLOCK_ID, 6, 6], dtype=torch.int32)
    qsl = torch.arange(0, 5 * T, T, dtype=torch.int32)
    write_pos, fold_len = torch.full((4,), -7, dtype=torch.int32), torch.full((4,), -7, dtype=torch.int32)
    for _ in range(2):
        table.verify_step(slots, qsl, torch.full((4,), T, dtype=torch.int32), write_pos, fold_len, real_rows=2)
    assert write_pos.tolist()[1:] == [0, 0, 0] and fold_len.tolist()[1:] == [0, 0, 0]
    assert table.positions[NULL_BLOCK_ID].item() == 0 and table.pending[NULL_BLOCK_ID].item() == 0
    assert table.positions[6].item() == T  # the second verify committed the first's T entries


def test_take_pending_counts_the_accepted_prefix_of_the_last_verify():
    table = _spec_table()
    _verify(table, [2, 5], [1, 1])
    _verify(table, [2, 5], [T, 1])
    pending = table.take_pending(torch.tensor([2, 5], dtype=torch.int32), None, torch.tensor([2, 1]))
    assert pending.tolist() == [T + 2, 1 + 1]
    assert table.positions[[2, 5]].tolist() == [0, 0] and table.pending[[2, 5]].tolist() == [0, 0]
    assert _verify(table, [2], [T]) == ([0], [0])  # the prefill wrote the state: nothing to commit after it


def test_staggered_first_window_folds_earlier_under_speculation():
    table = CursorTable(num_blocks=64, buffer_len=L, device="cpu", stagger=True, verify_len=T)
    slot = int((first_window_end(torch.arange(64), L, True) < L - 1).nonzero()[0])
    end = int(table.window_end[slot])
    seen = [_verify(table, [slot], [1]) for _ in range(L + 2)]
    first_fold = next(t for t, (_, f) in enumerate(seen) if f[0])
    assert first_fold == end + 2 and seen[first_fold][1] == [end + 2]  # a history past the window's end + 1 folds
    assert table.window_end[slot].item() == L - 1
