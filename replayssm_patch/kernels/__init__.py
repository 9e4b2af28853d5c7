"""ReplaySSM Mamba-2 decode kernels: the API the vLLM integration (replayssm_patch/*.py) codes against.

Why this exists: baseline decode reads AND writes every sequence's full SSM state each step. ReplaySSM
keeps a checkpoint h_c (state at the ring start) plus a ring of the last step inputs, answers each step
from them reading the checkpoint only, and folds the ring into the checkpoint once every L steps.

Math (per sequence, head h with group g = h // (nheads // ngroups), ring entries s = 0..w):
    S_j = dt_0 + ... + dt_j                      (dt already softplus'ed, bias added)
    y_t = exp(A*S_w) * (h_c . C_t) + sum_s exp(A*(S_w - S_s)) * dt_s * (B_s . C_t) * x_s + D * x_t
    flush(n):  h_c' = exp(A*S_{n-1}) * h_c + sum_{s<n} exp(A*(S_{n-1} - S_s)) * dt_s * x_s (x) B_s
y_t is exactly the baseline recurrence h_t = exp(A dt_t) h_{t-1} + dt_t x_t (x) B_t ; y_t = h_t . C_t + D x_t.
z-gating is NOT applied here (vLLM's gated RMSNorm does it); D multiplies the current token only.

Cache layout per slot (the vLLM state index of a sequence; ``slot`` rows below), any strides allowed
(so they may be views into vLLM's KV-cache pages):
    ssm_state   [slots, nheads, head_dim, d_state]      checkpoint h_c: vLLM's own ssm_state (fp32 master,
                                                         or bf16 when the server runs a bf16 state)
    state_bf16  [slots, nheads, head_dim, d_state] bf16  split-precision copy that replay steps read
    ring_x      [slots, nheads, L, head_dim]            post-conv x  (model dtype; bf16 is lossless)
    ring_B      [slots, ngroups, L, d_state]            B            (model dtype)
    ring_dt     [slots, nheads, L]            fp32      softplus(dt + dt_bias)
(head-major: a program's entries are one contiguous run; ``layout.ring_entries`` views them entry-major)
``ring_shapes`` gives these per-slot shapes/dtypes for the KV-cache spec; ``ReplayCache`` allocates dense
ones (tests, benchmarks).

Per-row metadata (int32 [batch] device tensors, CUDA-graph safe: kernels read them, never Python):
    state_indices  slot of each batch row; a row whose slot == pad_slot_id (or < 0) is padding:
                   skipped entirely, nothing read or written (output row left untouched).
    write_pos      ring position of the CURRENT token = number of entries already in the ring (0..L-1).
    flush_len      decode step: > 0 folds the whole ring, this step included (write_pos + 1 entries), on the
                   step that ends the row's window (L-1, or earlier for a staggered first window); 0 = no flush.
                   ``flush_ring`` (materialise before a prefill): the number of entries from position 0.
After a flush the sequence's next write_pos is 0. Entries at positions >= write_pos are never read, so a
reused slot needs no ring reset (stale or non-finite values cannot leak); a new sequence must start at
write_pos 0 with a checkpoint its prefill wrote (and, in split precision, ``copy_state_to_bf16`` after it).

Prefill that reads stored state (chunked prefill, resumed sequence): first ``flush_ring`` with flush_len =
the row's ring count (materialise), let vLLM's prefill read/write ssm_state, then ``copy_state_to_bf16``
for those slots (split precision) and restart the row at write_pos 0.

Entry points (Triton on CUDA or under TRITON_INTERPRET=1; each has a ``*_reference`` twin in plain
PyTorch with the same signature):
    replay_decode(...)      append x/B/dt at write_pos and return y for every row. Writes the ring only.
    replay_decode_step(...) the decode step: the same, with flush rows folding into ssm_state (+ state_bf16)
                            instead (three launches per layer: per-(row, group) coefficients, the 1-warp
                            replay, the fold over the flush rows; see ``replay_decode``'s docstring). At
                            small batches (``launch_config.native_max_batch``, measured by the kernel bench)
                            the layer runs vLLM's one-kernel decode on the checkpoint instead.
    flush_ring(...)         fold flush_len entries into ssm_state (fp32 master) and refresh state_bf16.
    plan_decode_rows(...)   the builder's per-step cursor plan in one launch (``cursors.CursorTable``).
    plan_take_pending(...)  the ring entries a prefill row folds first, restarting its cursor (one launch).
    replay_verify_step(...) speculative decoding: fold rows whose history would overflow the ring (fold_len > 0),
                            then answer all T = 1+k query tokens of every row from one checkpoint read, appending
                            them at write_pos.. (ring of L + T entries; ``verify``'s docstring has the math).
    plan_verify_rows(...)   its cursor plan: commit the accepted prefix of the last verify, fold, append.
    copy_state_to_bf16(...) refresh the bf16 copy of given slots (after prefill wrote the master).
    decode_flush_len(write_pos, L) -> flush_len for a plain decode step (L where write_pos == L-1).

Gated DeltaNet (Qwen3-Next, Qwen3.5) has its own kernels, ``gdn_*.py``: the ring holds the normalised key,
the corrected value u = β (v − e^g S k̂) and the log-decay g, all fp32 beside an fp32 checkpoint; split precision
adds a bf16 copy for the replay to read, and β and the raw v to the ring, so that a flush replays its window exactly
on the master (u depends on the state: a u from the copy folded in would feed its rounding into the master).
``gdn_decode_step`` answers o from checkpoint + ring and folds the ring on flush rows (three launches:
coefficients per key head, the replay, the fold over the flush-row list, as ``replay_decode_step``; vLLM's own
decode at the native batches, ``launch_config.gdn_native_max_batch``);
``gdn_mixed_decode`` is the same step for the decode rows of a step with prefills, which runs eagerly: one launch
with the causal conv inside; ``gdn_flush_ring`` folds before a prefill. The math is in ``gdn_decode``'s
docstring, the layout in ``gdn_layout``'s; the same per-row metadata (state_indices, write_pos, flush_len) drives them.

Checks: ``python -m replayssm_patch.kernels.compile_check`` compiles every default variant for sm_90 on
any machine; ``python -m replayssm_patch.gpu.kernel_bench --out DIR`` measures them against vLLM on a GPU
(``gdn_kernel_bench`` the GDN step).
"""

from replayssm_patch.kernels.cursor_plan import (
    plan_decode_rows,
    plan_decode_rows_reference,
    plan_take_pending,
    plan_take_pending_reference,
    plan_verify_rows,
    plan_verify_rows_reference,
)
from replayssm_patch.kernels.decode_step import replay_decode_step, replay_decode_step_reference
from replayssm_patch.kernels.flush import flush_ring, flush_ring_reference
from replayssm_patch.kernels.gdn_decode import gdn_decode_step, gdn_decode_step_reference
from replayssm_patch.kernels.gdn_flush import gdn_flush_ring, gdn_flush_ring_reference
from replayssm_patch.kernels.gdn_layout import GdnReplayCache, GdnRingShapes, GdnSplitTensors, gdn_ring_shapes
from replayssm_patch.kernels.gdn_mixed_decode import gdn_mixed_decode, gdn_mixed_decode_reference
from replayssm_patch.kernels.layout import (
    PAD_SLOT_ID,
    ReplayCache,
    RingShapes,
    copy_state_to_bf16,
    decode_flush_len,
    ring_shapes,
)
from replayssm_patch.kernels.replay_decode import replay_decode, replay_decode_reference
from replayssm_patch.kernels.verify import (
    replay_verify,
    replay_verify_reference,
    replay_verify_step,
    replay_verify_step_reference,
)

__all__ = [
    "PAD_SLOT_ID",
    "GdnReplayCache",
    "GdnRingShapes",
    "GdnSplitTensors",
    "ReplayCache",
    "RingShapes",
    "copy_state_to_bf16",
    "decode_flush_len",
    "flush_ring",
    "flush_ring_reference",
    "gdn_decode_step",
    "gdn_decode_step_reference",
    "gdn_flush_ring",
    "gdn_flush_ring_reference",
    "gdn_mixed_decode",
    "gdn_mixed_decode_reference",
    "gdn_ring_shapes",
    "plan_decode_rows",
    "plan_decode_rows_reference",
    "plan_take_pending",
    "plan_take_pending_reference",
    "plan_verify_rows",
    "plan_verify_rows_reference",
    "replay_decode",
    "replay_decode_reference",
    "replay_decode_step",
    "replay_decode_step_reference",
    "replay_verify",
    "replay_verify_reference",
    "replay_verify_step",
    "replay_verify_step_reference",
    "ring_shapes",
]
