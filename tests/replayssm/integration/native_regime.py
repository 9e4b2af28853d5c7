"""What a native-regime scenario must show, for the Mamba-2 (vllm_layer_check.py) and the Gated DeltaNet
(vllm_gdn_checks.py) layers alike: both drive vllm_checks.NATIVE_SCHEDULE through their real builders."""

from __future__ import annotations

# vllm_checks.NATIVE_SCHEDULE with L = 4 and windows aligned to the prefill (a row folds when its ring fills)
NATIVE_REGIME = [False] * 3 + [True] * 3 + [False] * 3 + [True] * 2 + [False]
NATIVE_TRANSITIONS = [None] * 3 + [[3, 3], None, None] + [None] * 3 + [[2], None, None]
NATIVE_CURSORS = [[1, 1, 1], [2, 2, 2], [3, 3, 3], [0, 0, 3], [0, 0, 3], [0, 0, 3],
                  [1, 1, 0], [2, 2, 1], [3, 3, 2], [3, 3, 0], [3, 3, 0], [0, 0, 1]]  # fmt: skip
# split precision: a native step's rows flush at their next replay step (a window of one entry), so step 6 flushes
# every row (slots 1 and 2 after the first native run, slot 3 its full ring) and step 11 slot 3
NATIVE_CURSORS_SPLIT = [[1, 1, 1], [2, 2, 2], [3, 3, 3], [0, 0, 3], [0, 0, 3], [0, 0, 3],
                        [0, 0, 0], [1, 1, 1], [2, 2, 2], [2, 2, 0], [2, 2, 0], [3, 3, 0]]  # fmt: skip
ALL_ROWS_FLUSH_SPLIT = 6  # the step of NATIVE_SCHEDULE that answers every row from the fp32 master in split precision


def assert_native_regime(got: dict, output_tolerance: float, state_tolerance: float, split: bool = False) -> None:
    """Decode steps through the real builders under a launch table whose native limit is 2 rows, the batch crossing
    it both ways (3 rows, 2, 3, 1, 3): graphs of 2 rows are captured native, of 3 the ring's. The first native step
    folds its rows' rings (3 entries each) and restarts them; slot 3, left out of that step, keeps its 3 entries and
    folds them on its next replay step (its ring full), and slots 1 and 2 do the same around the second transition.
    A native step plans nothing (cursors and rings untouched) and is vLLM's own layer, bit for bit, from the
    ReplaySSM checkpoint; every step agrees with vLLM's layer from the start, and so does the final state.

    ``split``: the layers read a bf16 copy that their native steps leave stale. Each row of a native step flushes at
    its next replay step instead, answered from the fp32 master (within ``state_tolerance`` of vLLM's on the step
    where every row flushes); the other replay steps carry the copy's rounding (``output_tolerance``)."""
    assert got["captured_native"] == {"2": True, "3": False} and got["table_allocated_by_captures"] is False
    steps = got["steps"]
    assert [step["native"] for step in steps] == NATIVE_REGIME
    assert [step["transition"] for step in steps] == NATIVE_TRANSITIONS
    assert [step["cursors"] for step in steps] == (NATIVE_CURSORS_SPLIT if split else NATIVE_CURSORS)
    assert [step["rings_untouched"] for step in steps] == NATIVE_REGIME, "only replay steps append to a ring"
    assert all(step["equals_vllm_bit_for_bit"] for step in steps if step["native"])
    assert all(step["twin_equal"] for step in steps), "the other layer folded at every transition too"
    assert max(step["rel_err"] for step in steps) <= output_tolerance
    assert got["pending_at_end"] == ([3, 3, 0] if split else [0, 0, 1])
    if split:
        assert steps[ALL_ROWS_FLUSH_SPLIT]["rel_err"] <= state_tolerance, "flush rows answer from the fp32 master"
    assert got["state_rel_err"] <= state_tolerance and got["twin_state_equal"] and got["conv_state_equal"]
