"""Mamba-2 attention backend whose metadata builder plans the ReplaySSM ring for every step.

Why in the builder: it runs on the CPU before every step, including steps that replay a captured CUDA
graph, so it is where cursors can advance. It writes each decode row's write position and flush length
into persistent buffers (fixed addresses the graph reads) and, for prefill rows, the ring entry counts
the layer must fold into the checkpoint first. CUDA-graph capture builds (dummy batches) write
zeros and never advance real cursors.
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

from replayssm_patch.config import replayssm_config_of
from replayssm_patch.cursors import CursorTable

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's logger


@dataclass
class ReplayMamba2AttentionMetadata(Mamba2AttentionMetadata):
    # Decode rows: one per state_indices_tensor_d row (graph padding rows get 0).
    replay_write_pos: torch.Tensor | None = None
    replay_flush_len: torch.Tensor | None = None
    # Steps with a prefill: ring entries per prefill row to fold into the checkpoint first.
    replay_pending: torch.Tensor | None = None


class ReplayMamba2AttentionMetadataBuilder(Mamba2AttentionMetadataBuilder):
    metadata_cls = ReplayMamba2AttentionMetadata
    # vLLM builds the first Mamba KV-cache group each step and updates the others' block tables from it
    # (update_block_table). Every group holds the same requests at the same point, so a request's ring
    # cursor is the same in all of them: the first group's builder keeps the cursor table and plans the
    # ring; the others copy that plan into their own graph buffers.

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.buffer_len = replayssm_config_of(vllm_config).buffer_len
        max_rows = vllm_config.scheduler_config.max_num_seqs
        self.write_pos = torch.zeros(max_rows, dtype=torch.int32, device=device)
        self.flush_len = torch.zeros(max_rows, dtype=torch.int32, device=device)
        self.cursors: CursorTable | None = None  # sized at the first build, once the KV cache is bound
        self.full_decode_graphs = vllm_config.compilation_config.cudagraph_mode.has_full_cudagraphs()
        self._capturing = False

    def _cursor_table(self) -> CursorTable:
        if self.cursors is None:
            layer = self.vllm_config.compilation_config.static_forward_context[self.layer_names[0]]
            num_blocks = layer.kv_cache[1].shape[0]
            self.cursors = CursorTable(num_blocks, self.buffer_len, self.write_pos.device)
        return self.cursors

    def build_for_cudagraph_capture(self, common_attn_metadata: Any) -> ReplayMamba2AttentionMetadata:
        self._capturing = True
        try:
            return super().build_for_cudagraph_capture(common_attn_metadata)
        finally:
            self._capturing = False

    def build(
        self, common_prefix_len: int, common_attn_metadata: Any, fast_build: bool = False, **kwargs: Any
    ) -> ReplayMamba2AttentionMetadata:
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build, **kwargs)
        if metadata.num_prefills and common_attn_metadata.max_query_len == 1 and self.full_decode_graphs:
            warn_single_token_prompts()
        return plan_ring(metadata, self._cursor_table, self.write_pos, self.flush_len, dry_run=self._capturing)

    def update_block_table(
        self, metadata: ReplayMamba2AttentionMetadata, blk_table: torch.Tensor, slot_mapping: torch.Tensor
    ) -> ReplayMamba2AttentionMetadata:
        """Another group's metadata for this group's blocks, with that group's ring plan in this builder's
        buffers (the addresses this group's captured decode graphs read)."""
        updated = super().update_block_table(metadata, blk_table, slot_mapping)
        return copy_ring_plan(updated, self.write_pos, self.flush_len)


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
    write_pos_buffer: torch.Tensor,
    flush_len_buffer: torch.Tensor,
    *,
    dry_run: bool,
) -> ReplayMamba2AttentionMetadata:
    """Attach this step's ring plan to ``metadata`` (``cursor_table`` is called only when cursors move).

    Decode rows append to their ring whether or not the step also holds prefills (decode rows come first in
    vLLM's batch); prefill rows get the entries their ring still holds (to fold in before vLLM's prefill
    reads the checkpoint) and restart at 0.
    """
    rows = 0 if metadata.state_indices_tensor_d is None else metadata.state_indices_tensor_d.shape[0]
    write_pos, flush_len = write_pos_buffer[:rows], flush_len_buffer[:rows]
    if rows:
        write_pos.zero_()
        flush_len.zero_()
        if not dry_run and metadata.num_decodes:
            real = metadata.num_decodes
            slots = metadata.state_indices_tensor_d[:real, 0]
            cursor_table().decode_step(slots, write_pos[:real], flush_len[:real])
    pending = None
    if metadata.num_prefills:
        pending = cursor_table().take_pending(metadata.state_indices_tensor_p, metadata.has_initial_states_p)
    return replace(metadata, replay_write_pos=write_pos, replay_flush_len=flush_len, replay_pending=pending)


def copy_ring_plan(
    metadata: ReplayMamba2AttentionMetadata, write_pos_buffer: torch.Tensor, flush_len_buffer: torch.Tensor
) -> ReplayMamba2AttentionMetadata:
    """``metadata`` with its decode rows' plan copied into these persistent buffers (pending is eager-only)."""
    if metadata.replay_write_pos is None or metadata.replay_flush_len is None:
        return metadata
    rows = metadata.replay_write_pos.shape[0]
    write_pos, flush_len = write_pos_buffer[:rows], flush_len_buffer[:rows]
    write_pos.copy_(metadata.replay_write_pos)
    flush_len.copy_(metadata.replay_flush_len)
    return replace(metadata, replay_write_pos=write_pos, replay_flush_len=flush_len)


class ReplayMamba2AttentionBackend(Mamba2AttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "REPLAYSSM_MAMBA2_ATTN"

    @staticmethod
    def get_builder_cls() -> type[ReplayMamba2AttentionMetadataBuilder]:
        return ReplayMamba2AttentionMetadataBuilder
