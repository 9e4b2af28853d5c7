"""Gated DeltaNet attention backend whose metadata builder plans the ReplaySSM ring for every step.

Why one build per step: every GDN KV-cache group holds the same requests at the same point, so vLLM's
``update_block_table`` hook (which its own GDN builder does not offer) lets the first group's build serve the
others: they take its metadata and its ring plan with their own block ids, and the cursor table, indexed by the
first group's blocks, moves once per step. On the H200 (2026-12-03, qwen3.5-4b under churn) the three builds took
1.9 ms per step under cProfile, ~0.9 ms more than vLLM's own (BENCHMARKS.md, session 14). The plan (write position
and flush length per decode row, and the list of flush rows the fold walks) goes into persistent buffers shared by
every group, the addresses a captured CUDA graph reads; capture builds write zeros and never move a cursor.

Two things differ from the Mamba-2 builder. vLLM counts a new one-token prompt as a GDN decode row (it does
not look at ``is_prefilling``), and its own layer then reads the slot's previous owner's state; here such a
row restarts its cursor and gets a zero checkpoint and conv state, as a prefill without initial state would.
And a mixed step carries a prefill-only view of the metadata, which the layer hands to vLLM's own path for
the prefill rows while it replays the decode rows itself.

Native regime, as for Mamba-2 (``backend.plan_ring``): decode batches up to the launch table's
``gdn_native_max_batch`` run vLLM's own decode path on the fp32 checkpoint, and the first such step after a
replay-regime one folds what its rows' rings hold first, here for this group's layers; in split precision each row of
a native step flushes at its next replay-regime step (``backend.stale_copies_flush_next``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from vllm.v1.attention.backends.gdn_attn import (
    GDNAttentionBackend,
    GDNAttentionMetadata,
    GDNAttentionMetadataBuilder,
)
from vllm.v1.attention.backends.utils import compute_causal_conv1d_metadata

from replayssm_patch.backend import (
    RingPlanBuffers,
    mixed_steps_native,
    native_regime,
    prefills_all_fresh,
    ring_may_hold_after,
    stale_copies_flush_next,
    warm_eager_kernels,
)
from replayssm_patch.config import replayssm_config_of
from replayssm_patch.cursors import NULL_BLOCK_ID, CursorTable


@dataclass
class ReplayGDNAttentionMetadata(GDNAttentionMetadata):
    # Decode rows: one per replayed row (all rows of a decode-only step, CUDA-graph padding included).
    replay_write_pos: torch.Tensor | None = None
    replay_flush_len: torch.Tensor | None = None
    # The rows with replay_flush_len > 0, listed first, and how many there are (int32 [1]): the fold's work list.
    replay_flush_rows: torch.Tensor | None = None
    replay_flush_count: torch.Tensor | None = None
    # Steps with a prefill: ring entries per prefill row to fold into the checkpoint first.
    replay_pending: torch.Tensor | None = None
    # False when the CPU knows every prefill row is a fresh sequence: the layers launch no fold for them.
    replay_fold_pending: bool = False
    # Mixed steps: the prefill rows alone, for vLLM's own path (None: no decode rows to peel off).
    prefill_view: GDNAttentionMetadata | None = None
    # Decode rows of a batch small enough for vLLM's own decode path (the launch table's gdn_native_max_batch),
    # decided by the batch size alone so a captured graph replays the same launches.
    replay_native: bool = False
    # The first native step after replay-regime ones: ring entries per decode row, which every group's layers fold
    # into their checkpoint before the forward (the rows' rings restart).
    replay_transition_pending: torch.Tensor | None = None
    # Decode rows that are a sequence's first token (CPU row numbers): every group zeroes their state and conv.
    replay_fresh_rows: torch.Tensor | None = None


class ReplayGDNAttentionMetadataBuilder(GDNAttentionMetadataBuilder):
    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.layer_names = layer_names
        # imported here, as the kernels are: Triton's mode (interpreter or GPU) is set before they load
        from replayssm_patch.kernels.launch_config import gdn_native_max_batch

        knobs = replayssm_config_of(vllm_config)
        self.buffer_len, self.stagger_windows = knobs.buffer_len, knobs.stagger_windows
        self.native_mixed_steps = knobs.native_mixed_steps
        self.split_precision = knobs.split_precision
        # no speculation to rule out here (the plugin refuses it for GDN)
        self.native_max_batch = gdn_native_max_batch(device, knobs.split_precision)
        self.ring_may_hold = False  # rings may hold entries a native step must fold first (CPU only)
        self.eager_kernels_warmed = False
        # one block per request (the plugin refuses prefix caching): the first group's metadata serves every group
        one_block = vllm_config.cache_config.mamba_cache_mode == "none"
        self.supports_update_block_table = one_block and not knobs.per_group_builds
        self.plan_buffers = (
            RingPlanBuffers.of_engine(vllm_config, device)
            if self.supports_update_block_table
            else RingPlanBuffers.allocate(vllm_config.scheduler_config.max_num_seqs, device)
        )
        self.cursors: CursorTable | None = None  # sized at the first real build, once the KV cache is bound
        self._capturing = False

    def _layers(self) -> list[Any]:
        context = self.vllm_config.compilation_config.static_forward_context
        return [context[name] for name in self.layer_names]

    def _cursor_table(self) -> CursorTable:
        if self.cursors is None:
            num_blocks = self._layers()[0].kv_cache[1].shape[0]
            self.cursors = CursorTable(
                num_blocks, self.buffer_len, self.plan_buffers.write_pos.device, stagger=self.stagger_windows
            )
        return self.cursors

    def build_for_cudagraph_capture(self, common_attn_metadata: Any) -> ReplayGDNAttentionMetadata:
        self._capturing = True
        try:
            metadata = super().build_for_cudagraph_capture(common_attn_metadata)
        finally:
            self._capturing = False
        warm_eager_kernels(self)
        return metadata

    def build(  # type: ignore[override]
        self,
        common_prefix_len: int,
        common_attn_metadata: Any,
        num_accepted_tokens: torch.Tensor | None = None,
        num_decode_draft_tokens_cpu: torch.Tensor | None = None,
        fast_build: bool = False,
    ) -> ReplayGDNAttentionMetadata:
        stock = super().build(
            common_prefix_len, common_attn_metadata, num_accepted_tokens, num_decode_draft_tokens_cpu, fast_build
        )
        metadata = ReplayGDNAttentionMetadata(**{f.name: getattr(stock, f.name) for f in fields(stock)})
        m = common_attn_metadata
        if not self._capturing and metadata.num_decodes:
            fresh = first_token_rows(m.seq_lens_cpu_upper_bound, metadata.num_decodes)
            if fresh.numel():
                metadata.replay_fresh_rows = fresh
                slots = self._fresh_slots(metadata, metadata.non_spec_state_indices_tensor)
                self._cursor_table().take_pending(slots, torch.zeros_like(slots, dtype=torch.bool))
                self._zero_states(slots)
        metadata = plan_gdn_ring(
            metadata, self._cursor_table, self.plan_buffers, dry_run=self._capturing,
            native_max_batch=self.native_max_batch, ring_may_hold=self.ring_may_hold,
            fresh=prefills_all_fresh(m, metadata.num_prefills),
            native_mixed=mixed_steps_native(self.native_mixed_steps, m), split_precision=self.split_precision,
        )  # fmt: skip
        self._fold_transition(metadata)
        self.ring_may_hold = ring_may_hold_after(metadata, self.ring_may_hold, self._capturing)
        if metadata.num_decodes and metadata.num_prefills and not metadata.replay_native:
            metadata.prefill_view = prefill_only_view(stock, m.query_start_loc_cpu)
        return metadata

    def update_block_table(
        self, metadata: ReplayGDNAttentionMetadata, blk_table: torch.Tensor, slot_mapping: torch.Tensor
    ) -> ReplayGDNAttentionMetadata:
        """The first group's metadata and ring plan at this group's blocks (vLLM calls it for every later group
        with an equal spec). A decode-only step's indices and query starts go into this builder's persistent
        buffers, which its captured graphs read; the fresh rows' zeroing and a native transition's fold are done
        here for this group's layers, as ``build`` did them for the first group's."""
        del slot_mapping  # GDN layers address their state by block id alone
        indices = blk_table[:, 0]
        query_start_loc = metadata.non_spec_query_start_loc
        decodes = metadata.num_decodes
        if self.use_full_cuda_graph and not metadata.num_prefills and decodes <= self.decode_cudagraph_max_bs:
            padded = metadata.non_spec_state_indices_tensor.shape[0]
            self.non_spec_state_indices_tensor[:decodes].copy_(indices[:decodes], non_blocking=True)
            indices = self.non_spec_state_indices_tensor[:padded]
            indices[decodes:].fill_(NULL_BLOCK_ID)
            query_start_loc = self.non_spec_query_start_loc[: padded + 1]
            query_start_loc.copy_(metadata.non_spec_query_start_loc, non_blocking=True)
        prefill_indices = None
        if metadata.num_prefills:
            prefill_indices = indices[decodes:] if decodes else indices
        view = metadata.prefill_view
        if view is not None:
            view = replace(view, non_spec_state_indices_tensor=prefill_indices, prefill_state_indices=prefill_indices)
        ours = replace(
            metadata, non_spec_state_indices_tensor=indices, non_spec_query_start_loc=query_start_loc,
            prefill_state_indices=prefill_indices, prefill_view=view,
        )  # fmt: skip
        if ours.replay_fresh_rows is not None:
            self._zero_states(self._fresh_slots(ours, indices))
        self._fold_transition(ours)
        return ours

    @staticmethod
    def _fresh_slots(metadata: ReplayGDNAttentionMetadata, indices: torch.Tensor) -> torch.Tensor:
        assert metadata.replay_fresh_rows is not None
        return indices.index_select(0, metadata.replay_fresh_rows.to(indices.device)).long()

    def _zero_states(self, slots: torch.Tensor) -> None:
        """New sequences vLLM lets decode from a reused slot start from a zero checkpoint (and copy) and conv state
        (their cursor restarts once, in the first group's build)."""
        from replayssm_patch.gdn_state_layout import STATE_BF16  # kernels load after Triton's mode is set

        for layer in self._layers():
            for state in (0, 1, STATE_BF16) if self.split_precision else (0, 1):
                layer.kv_cache[state].index_fill_(0, slots, 0)

    def _fold_transition(self, metadata: ReplayGDNAttentionMetadata) -> None:
        """The first native step after replay-regime ones: fold this group's rings into its checkpoints, eagerly
        before the forward, as vLLM's own path reads current checkpoints."""
        transition = metadata.replay_transition_pending
        if transition is not None:
            slots = metadata.non_spec_state_indices_tensor[: transition.shape[0]]
            for layer in self._layers():
                layer.materialise(slots, transition)


def first_token_rows(seq_lens_cpu: torch.Tensor | None, num_decodes: int) -> torch.Tensor:
    """Which decode rows are a sequence's first token (sequence length 1: no state computed yet), as CPU row
    numbers read from vLLM's CPU sequence lengths, so no device sync. Graph padding rows (length 0) are not."""
    if seq_lens_cpu is None:
        return torch.zeros(0, dtype=torch.long)
    return (seq_lens_cpu[:num_decodes] == 1).nonzero().squeeze(1)


def plan_gdn_ring(
    metadata: ReplayGDNAttentionMetadata,
    cursor_table: Any,
    buffers: RingPlanBuffers,
    *,
    dry_run: bool,
    native_max_batch: int = 0,
    ring_may_hold: bool = False,
    fresh: bool = False,
    native_mixed: bool = False,
    split_precision: bool = False,
) -> ReplayGDNAttentionMetadata:
    """Attach this step's ring plan (``cursor_table`` is called only when cursors move).

    Decode rows come first in vLLM's batch and append to their ring whether or not the step holds prefills;
    a decode-only step plans every row of its (possibly graph-padded) state indices, whose padding rows carry
    the null block and stay put. Prefill rows get the entries their ring still holds, then restart at 0.
    The plan also lists the flush rows for the decode step's fold; a capture build (``dry_run``) plans zeros,
    an empty list, and moves no cursor.

    Native regime: decode rows of at most ``native_max_batch`` (padding included) are planned nothing and move no
    cursor; with ``ring_may_hold`` their pending entries are taken first (``replay_transition_pending``, restarting
    their rings). Only this step's rows, as in ``backend.plan_ring``: vLLM shares each KV-cache tensor between
    one layer of every group, so a finished sequence's stale cursor would fold into a block another group holds.
    ``native_mixed``: see ``backend.native_regime``; ``split_precision``: see ``backend.plan_ring``.
    """
    indices = metadata.non_spec_state_indices_tensor
    rows = 0 if indices is None or not metadata.num_decodes else metadata.num_decodes
    if rows and not metadata.num_prefills:
        rows = indices.shape[0]
    native = native_regime(rows, metadata.num_prefills, native_max_batch, native_mixed)
    transition = None
    write_pos, flush_len, flush_rows = buffers.write_pos[:rows], buffers.flush_len[:rows], buffers.flush_rows[:rows]
    if native:  # nothing to plan and no cursor to move: no launch
        if ring_may_hold and not dry_run:
            transition = cursor_table().take_pending(indices[:rows])
    elif rows:
        if dry_run:
            write_pos.zero_()
            flush_len.zero_()
            buffers.flush_count.zero_()
        else:
            real = metadata.num_decodes
            cursor_table().decode_step(indices[:real], write_pos, flush_len, real, flush_rows, buffers.flush_count)
    pending = None
    if metadata.num_prefills:
        pending = cursor_table().take_pending(metadata.prefill_state_indices, metadata.prefill_has_initial_state)
    if native and split_precision and not dry_run:
        stale_copies_flush_next(cursor_table(), indices[:rows], metadata.prefill_state_indices)
    return replace(
        metadata,
        replay_write_pos=write_pos,
        replay_flush_len=flush_len,
        replay_flush_rows=flush_rows,
        replay_flush_count=buffers.flush_count,
        replay_pending=pending,
        replay_fold_pending=bool(metadata.num_prefills) and not fresh,
        replay_native=native,
        replay_transition_pending=transition,
    )


def prefill_only_view(stock: GDNAttentionMetadata, query_start_loc_cpu: torch.Tensor) -> GDNAttentionMetadata:
    """The prefill rows of a mixed step as a step of their own, for vLLM's layer code.

    vLLM's builder already rebased the chunk kernel's inputs (``prefill_*``, chunk indices) onto the prefill
    rows; the conv kernel's inputs (query starts, state indices, initial-state flags and its launch metadata)
    still cover the decode rows, so they are cut and rebased here.
    """
    decodes, decode_tokens = stock.num_decodes, stock.num_decode_tokens
    qsl_cpu = query_start_loc_cpu[decodes:] - decode_tokens
    assert stock.prefill_query_start_loc is not None
    nums_dict, batch_ptr, token_chunk_offset_ptr = compute_causal_conv1d_metadata(
        qsl_cpu, device=stock.prefill_query_start_loc.device
    )
    return replace(
        stock,
        num_decodes=0,
        num_decode_tokens=0,
        num_actual_tokens=stock.num_actual_tokens - decode_tokens,
        has_initial_state=stock.prefill_has_initial_state,
        non_spec_query_start_loc=stock.prefill_query_start_loc,
        non_spec_state_indices_tensor=stock.prefill_state_indices,
        nums_dict=nums_dict,
        batch_ptr=batch_ptr,
        token_chunk_offset_ptr=token_chunk_offset_ptr,
    )


class ReplayGDNAttentionBackend(GDNAttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "REPLAYSSM_GDN_ATTN"

    @staticmethod
    def get_builder_cls() -> type[ReplayGDNAttentionMetadataBuilder]:
        return ReplayGDNAttentionMetadataBuilder


__all__ = ["NULL_BLOCK_ID", "ReplayGDNAttentionBackend", "ReplayGDNAttentionMetadata"]
