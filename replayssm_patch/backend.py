"""Mamba-2 attention backend whose metadata builder plans the ReplaySSM ring for every step.

Why in the builder: it runs on the CPU before every step, including steps that replay a captured CUDA
graph, so it is where cursors can advance. It writes each decode row's write position and flush length
into persistent buffers (fixed addresses the graph reads, shared by every Mamba KV-cache group) in one
launch and, for prefill rows, the ring entry counts the layer must fold into the checkpoint first.
CUDA-graph capture builds (dummy batches) write zeros and never advance real cursors.

Native regime: at decode batches up to the launch table's ``native_max_batch`` vLLM's one fused kernel beats the
ring's three launches per layer, so those steps run vLLM's own decode path on the fp32 checkpoint, planning nothing
(``plan_ring``). The first such step after a replay-regime one folds what its rows' rings hold first. Split
precision has its own limit (its replay is cheaper); vLLM's path leaves the bf16 copy stale, so each row of a native
step flushes at its next replay-regime step, answered from the master, which rewrites the copy.

Under speculative decoding every decode row is a verify of 1..1+k tokens: the plan commits the accepted prefix of
each row's last verify (vLLM's num_accepted_tokens, on the device), decides which rows fold their history before
appending, and gives each row its write position. vLLM's own builder turns ``update_block_table`` off under
speculation (its 1 + k state blocks per request); ReplaySSM's keeps one block per request, so it turns it back on:
vLLM builds the first Mamba group and derives the others, one build and one cursor plan a step instead of one per
group (Nemotron-H-8B: 6), host time a spec step near vLLM's host floor cannot spare. ``per_group_builds`` keeps
a build per group, each with its own cursor table and plan buffers (the control arm).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, replace
from typing import Any

import torch
from vllm.v1.attention.backends.mamba2_attn import (
    Mamba2AttentionBackend,
    Mamba2AttentionMetadata,
    Mamba2AttentionMetadataBuilder,
)

from replayssm_patch.config import replayssm_config_of, verify_len_of
from replayssm_patch.cursors import CursorTable

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's logger


@dataclass
class ReplayMamba2AttentionMetadata(Mamba2AttentionMetadata):
    # Decode rows: one per state_indices_tensor_d row (graph padding rows get 0).
    replay_write_pos: torch.Tensor | None = None
    replay_flush_len: torch.Tensor | None = None
    # The rows with replay_flush_len > 0 (speculative: replay_fold_len > 0), listed first, and how many there are
    # (int32 [1]): the fold's work list.
    replay_flush_rows: torch.Tensor | None = None
    replay_flush_count: torch.Tensor | None = None
    # Speculative decoding instead of replay_flush_len: committed entries each row folds before its verify.
    replay_fold_len: torch.Tensor | None = None
    # Steps with a prefill: ring entries per prefill row to fold into the checkpoint first, and whether any
    # row may have some (False when the CPU knows every prefill row is a fresh sequence: no fold launches).
    replay_pending: torch.Tensor | None = None
    replay_fold_pending: bool = False
    # Decode rows of a batch small enough for vLLM's own decode path on the checkpoint (the launch table's
    # native_max_batch): decided by the batch size alone, so a graph captured at that size replays the same launches.
    replay_native: bool = False
    # The first native step after replay-regime ones: ring entries per decode row, which every KV-cache group's
    # layers fold into their checkpoint at their own blocks before the forward (the rows' rings restart).
    replay_transition_pending: torch.Tensor | None = None


@dataclass(frozen=True)
class RingPlanBuffers:
    """The decode rows' plan every Mamba KV-cache group's graphs read: one set of persistent buffers per engine.

    vLLM builds the first Mamba group each step and derives the others with ``update_block_table``, which
    keeps this metadata's fields; every group holds the same requests at the same point, so one plan (and
    one cursor table) serves all groups and nothing is copied per group.
    """

    write_pos: torch.Tensor
    flush_len: torch.Tensor
    flush_rows: torch.Tensor
    flush_count: torch.Tensor

    @classmethod
    def allocate(cls, rows: int, device: torch.device) -> RingPlanBuffers:
        zeros = torch.zeros(3 * rows + 1, dtype=torch.int32, device=device)
        return cls(zeros[:rows], zeros[rows : 2 * rows], zeros[2 * rows : 3 * rows], zeros[3 * rows :])

    @classmethod
    def of_engine(cls, vllm_config: Any, device: torch.device) -> RingPlanBuffers:
        """Keyed by device and row count, not by config object: every group's captured graphs must see the
        same addresses however vLLM hands its config to each builder (one engine per process)."""
        rows = vllm_config.scheduler_config.max_num_seqs
        key = (str(device), rows)
        if key not in _PLAN_BUFFERS:
            _PLAN_BUFFERS[key] = cls.allocate(rows, device)
        return _PLAN_BUFFERS[key]


_PLAN_BUFFERS: dict[tuple[str, int], RingPlanBuffers] = {}


class ReplayMamba2AttentionMetadataBuilder(Mamba2AttentionMetadataBuilder):
    metadata_cls = ReplayMamba2AttentionMetadata

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device) -> None:
        # imported here, as the kernels are: Triton's mode (interpreter or GPU) is set before they load
        from replayssm_patch.kernels.launch_config import native_max_batch

        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        knobs = replayssm_config_of(vllm_config)
        self.buffer_len, self.stagger_windows = knobs.buffer_len, knobs.stagger_windows
        self.verify_len = verify_len_of(vllm_config)
        own_builds = bool(self.verify_len) and knobs.per_group_builds  # every group builds (and commits) on its own
        if self.verify_len:  # vLLM's builder turned it off for its 1 + k blocks per request; ours keeps one
            self.supports_update_block_table = not own_builds
        self.plan_buffers = (
            RingPlanBuffers.allocate(vllm_config.scheduler_config.max_num_seqs, device)
            if own_builds
            else RingPlanBuffers.of_engine(vllm_config, device)
        )
        self.cursors: CursorTable | None = None  # sized at the first build, once the KV cache is bound
        self.full_decode_graphs = vllm_config.compilation_config.cudagraph_mode.has_full_cudagraphs()
        # off under speculation (verify rows are not vLLM's decode rows)
        self.native_max_batch = 0 if self.verify_len else native_max_batch(device, knobs.split_precision)
        self.native_mixed_steps = knobs.native_mixed_steps  # refused with speculation
        self.split_precision = knobs.split_precision
        self.ring_may_hold = False  # rings may hold entries a native step must fold first (CPU only)
        self._capturing = False
        self.eager_kernels_warmed = False

    def _layers(self) -> list[Any]:
        context = self.vllm_config.compilation_config.static_forward_context
        return [context[name] for name in self.layer_names]

    def _cursor_table(self) -> CursorTable:
        if self.cursors is None:
            num_blocks = self._layers()[0].kv_cache[1].shape[0]
            self.cursors = CursorTable(
                num_blocks,
                self.buffer_len,
                self.plan_buffers.write_pos.device,
                stagger=self.stagger_windows,
                verify_len=self.verify_len,
            )
        return self.cursors

    def build_for_cudagraph_capture(self, common_attn_metadata: Any) -> ReplayMamba2AttentionMetadata:
        self._capturing = True
        try:
            metadata = super().build_for_cudagraph_capture(common_attn_metadata)
        finally:
            self._capturing = False
        warm_eager_kernels(self)
        return metadata

    def build(
        self, common_prefix_len: int, common_attn_metadata: Any, fast_build: bool = False, **kwargs: Any
    ) -> ReplayMamba2AttentionMetadata:
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build, **kwargs)
        if metadata.num_prefills and common_attn_metadata.max_query_len == 1 and self.full_decode_graphs:
            warn_single_token_prompts()
        fresh = prefills_all_fresh(common_attn_metadata, metadata.num_prefills)
        metadata = plan_ring(
            metadata, self._cursor_table, self.plan_buffers, dry_run=self._capturing, fresh=fresh,
            verify=bool(self.verify_len), num_accepted=kwargs.get("num_accepted_tokens"),
            native_max_batch=self.native_max_batch, ring_may_hold=self.ring_may_hold,
            native_mixed=mixed_steps_native(self.native_mixed_steps, common_attn_metadata),
            split_precision=self.split_precision,
        )  # fmt: skip
        self._fold_transition(metadata)
        self.ring_may_hold = ring_may_hold_after(metadata, self.ring_may_hold, self._capturing)
        return metadata

    def update_block_table(
        self, metadata: ReplayMamba2AttentionMetadata, blk_table: torch.Tensor, slot_mapping: torch.Tensor
    ) -> ReplayMamba2AttentionMetadata:
        """Another KV-cache group's metadata, derived by vLLM from the first group's: on the first native step
        its layers fold the same rows' pending entries, at this group's blocks."""
        updated = super().update_block_table(metadata, blk_table, slot_mapping)
        self._fold_transition(updated)
        return updated

    def _fold_transition(self, metadata: ReplayMamba2AttentionMetadata) -> None:
        """Fold the transition's pending entries into every layer's checkpoint of this group (eager, before the
        forward and outside any graph), so vLLM's own path reads current states."""
        if metadata.replay_transition_pending is None:
            return
        slots = metadata.state_indices_tensor_d[:, 0].to(torch.int32).contiguous()
        for layer in self._layers():
            layer.materialise(slots, metadata.replay_transition_pending)


def warm_eager_kernels(builder: Any) -> None:
    """Once per builder (either family's), from a capture build: those run at start-up, after the KV cache is bound
    and outside any graph, so the group's first layer compiles the kernels that steps with prefills launch eagerly
    then, not while serving (vLLM's JIT monitor named the materialise fold mid-run on the H200)."""
    from replayssm_patch.kernels.common import launchable_on

    if builder.eager_kernels_warmed or not launchable_on(builder.plan_buffers.write_pos.device):
        return
    builder._layers()[0].warm_eager_kernels()
    builder.eager_kernels_warmed = True


def stale_copies_flush_next(cursor_table: CursorTable, *slot_sets: torch.Tensor | None) -> None:
    """A native step in split precision: vLLM's own path wrote these rows' fp32 masters, not their bf16 copies, so
    each row's next replay-regime step flushes (a window of one entry, answered from the master, which rewrites the
    copy) instead of reading its stale copy. Called after the step's takes of pending entries, which restart windows;
    Mamba-2's [rows, blocks] indices give their first column."""
    for slots in slot_sets:
        if slots is not None and slots.numel():
            cursor_table.flush_at_next_replay(slots if slots.dim() == 1 else slots[:, 0])


def native_regime(rows: int, num_prefills: int, native_max_batch: int, native_mixed: bool) -> bool:
    """Whether a step's decode rows run vLLM's own path on the checkpoint (both families): a decode batch of at most
    ``native_max_batch`` rows, graph padding included, or with ``native_mixed`` any step with prefills. Such steps
    run eagerly, where the fold's one launch per layer costs less host time than the replay's launches."""
    return 0 < rows <= native_max_batch or (native_mixed and rows > 0 and num_prefills > 0)


def mixed_steps_native(knob: bool, common_attn_metadata: Any) -> bool:
    """The ``native_mixed_steps`` knob for this step: never for a step of one-token rows, which vLLM may run as the
    decode graph captured in the replay regime (see ``warn_single_token_prompts``); its launches would read a plan
    that the native regime does not write."""
    return knob and common_attn_metadata.max_query_len > 1


def ring_may_hold_after(metadata: Any, before: bool, capturing: bool) -> bool:
    """A builder's ``ring_may_hold`` after this step (both families). A replay-regime decode step appends to rings.
    A transition folds its rows; whether a running request may be missing from it, its ring unfolded: vLLM's
    scheduler gives every running request its token in a step without prefill rows (a decode needs one token of the
    budget), and only a prefill chunk can spend the budget before a running request's turn. So after a decode-only
    transition every ring is folded, and after one with prefills the next native steps fold their rows again."""
    if metadata.replay_transition_pending is not None:
        return bool(metadata.num_prefills)
    if metadata.num_decodes and not metadata.replay_native and not capturing:
        return True
    return before


def prefills_all_fresh(common_attn_metadata: Any, num_prefills: int) -> bool:
    """True when the CPU knows every prefill row starts a sequence (nothing computed before it), so no ring
    can hold entries to fold. vLLM orders decode rows first; seq_lens_cpu_upper_bound is exact for prefills."""
    seq_lens = common_attn_metadata.seq_lens_cpu_upper_bound
    if seq_lens is None or not num_prefills:
        return not num_prefills
    starts = common_attn_metadata.query_start_loc_cpu
    rows = common_attn_metadata.num_reqs
    query_lens = starts[rows - num_prefills + 1 : rows + 1] - starts[rows - num_prefills : rows]
    return bool((seq_lens[rows - num_prefills : rows] == query_lens).all())


@functools.cache
def warn_single_token_prompts() -> None:
    """Once per process: a step whose rows all have one token replays vLLM's decode graph even when one row is a
    new 1-token prompt, so no Python (fold, cursor plan) runs for that step; vLLM's stock layer has the same
    stale-index hazard there. Prompts of 2+ tokens never take this path."""
    logger.warning(
        "ReplaySSM: a step of one-token rows holds a new one-token prompt; vLLM replays its decode CUDA graph for "
        "it, so ring state of that step may be wrong. Send prompts of at least 2 tokens, or run with enforce-eager."
    )


def plan_ring(
    metadata: ReplayMamba2AttentionMetadata,
    cursor_table: Any,
    buffers: RingPlanBuffers,
    *,
    dry_run: bool,
    fresh: bool = False,
    verify: bool = False,
    num_accepted: torch.Tensor | None = None,
    native_max_batch: int = 0,
    ring_may_hold: bool = False,
    native_mixed: bool = False,
    split_precision: bool = False,
) -> ReplayMamba2AttentionMetadata:
    """Attach this step's ring plan to ``metadata`` (``cursor_table`` is called only when cursors move).

    Decode rows append to their ring whether or not the step also holds prefills (decode rows come first in
    vLLM's batch): one plan launch writes every row of the persistent buffers, padding included. Prefill rows
    get the entries their ring still holds (to fold in before vLLM's prefill reads the checkpoint) and restart.
    ``verify`` (a speculative server): decode rows are verifies (``CursorTable.verify_step``: commit the accepted
    prefix of the last verify, fold before an overflow, append) and the second buffer holds fold lengths;
    ``num_accepted`` is vLLM's per-request count for the whole batch, so prefill rows count their accepted prefix.
    A capture build (``dry_run``) plans zeros and moves no cursor.

    Native regime: decode rows of at most ``native_max_batch`` (graph padding included) are planned nothing and
    move no cursor; the layer runs vLLM's own decode path on the checkpoint. With ``ring_may_hold`` (a replay-regime
    decode step ran since, or the last transition had prefill rows: ``ring_may_hold_after``) their pending entries
    are taken first, restarting their rings, as ``replay_transition_pending`` for every group's layers to fold.
    Only this step's rows: vLLM shares each KV-cache tensor between one layer of every group and hands freed blocks
    to any group, so a finished sequence's stale cursor would fold into a block another group or an attention layer
    now holds. ``native_mixed``: see ``native_regime``. With ``split_precision`` every row of a native step (its
    prefill rows too) flushes at its next replay-regime step (``stale_copies_flush_next``).
    """
    rows = 0 if metadata.state_indices_tensor_d is None else metadata.state_indices_tensor_d.shape[0]
    native = native_regime(rows, metadata.num_prefills, native_max_batch, native_mixed)
    transition = None
    write_pos, lengths, flush_rows = buffers.write_pos[:rows], buffers.flush_len[:rows], buffers.flush_rows[:rows]
    if native:  # nothing to plan and no cursor to move: no launch
        if ring_may_hold and not dry_run:
            transition = cursor_table().take_pending(metadata.state_indices_tensor_d[:, 0])
    elif rows:
        slots = metadata.state_indices_tensor_d[:, 0]
        if dry_run or not metadata.num_decodes:
            write_pos.zero_()
            lengths.zero_()
            buffers.flush_count.zero_()
        elif verify:
            assert metadata.num_accepted_tokens is not None and metadata.query_start_loc_d is not None, (
                "ReplaySSM verify steps need vLLM's num_accepted_tokens (passed for every speculative build)"
            )
            cursor_table().verify_step(
                slots, metadata.query_start_loc_d, metadata.num_accepted_tokens, write_pos, lengths,
                real_rows=metadata.num_decodes, fold_rows=flush_rows, fold_count=buffers.flush_count,
            )  # fmt: skip
        else:
            cursor_table().decode_step(slots, write_pos, lengths, metadata.num_decodes, flush_rows, buffers.flush_count)
    pending = None
    if metadata.num_prefills:
        accepted = None
        if verify and num_accepted is not None:
            accepted = num_accepted[metadata.num_decodes : metadata.num_decodes + metadata.num_prefills]
        pending = cursor_table().take_pending(metadata.state_indices_tensor_p, metadata.has_initial_states_p, accepted)
    if native and split_precision and not dry_run:
        stale_copies_flush_next(cursor_table(), metadata.state_indices_tensor_d, metadata.state_indices_tensor_p)
    return replace(
        metadata,
        replay_write_pos=write_pos,
        replay_flush_len=None if verify else lengths,
        replay_flush_rows=flush_rows,
        replay_flush_count=buffers.flush_count,
        replay_fold_len=lengths if verify else None,
        replay_pending=pending,
        replay_fold_pending=bool(metadata.num_prefills) and not fresh,
        replay_native=native,
        replay_transition_pending=transition,
    )


class ReplayMamba2AttentionBackend(Mamba2AttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "REPLAYSSM_MAMBA2_ATTN"

    @staticmethod
    def get_builder_cls() -> type[ReplayMamba2AttentionMetadataBuilder]:
        return ReplayMamba2AttentionMetadataBuilder
