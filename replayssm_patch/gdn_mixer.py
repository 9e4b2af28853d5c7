"""The Gated DeltaNet layer with ReplaySSM state management (vLLM ``QwenGatedDeltaNetAttention`` replacement).

Every Qwen3-Next and Qwen3.5 (dense and MoE) GDN layer is this class once the knob is on. Only the core op
changes (``_forward_core``, which vLLM's custom op ``qwen_gdn_attention_core`` dispatches to): the input
projections, the z gate (vLLM's gated RMSNorm) and out_proj stay vLLM's. Decode rows (all of a decode-only
step, the first rows of a mixed one, and new one-token prompts, which vLLM counts as decodes) run vLLM's
causal-conv update, then the ReplaySSM step: append (k̂, u, g) to the ring, answer from checkpoint + ring,
and fold the ring into the fp32 checkpoint on the step that fills it. In a step with prefills, which runs
eagerly, the conv and the step are one launch (``gdn_mixed_decode``; knob ``gdn_one_launch_mixed``). Prefill
rows first fold what their ring still holds, then run vLLM's own path on a prefill-only view of the step's
metadata. At the builder's native batches (``gdn_backend.plan_gdn_ring``), and at every step with prefills
under ``native_mixed_steps``, the whole step is vLLM's own path on the checkpoint, which the builder made
current; the ring is not used.
With ``split_precision`` the replay reads a bf16 copy of the checkpoint and a flush replays the window exactly
(``kernels.gdn_decode``, and the one-launch kernel's split form); vLLM's own path leaves the copy stale, so a
prefill's checkpoints are copied after it, and a native step's rows flush at their next replay step (the builder
marks them, ``backend.stale_copies_flush_next``).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import torch
from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.custom_op import PluggableLayer, op_registry_oot
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update
from vllm.v1.kv_cache_interface import MambaSpec

from replayssm_patch.config import ReplaySSMConfig, replayssm_config_of
from replayssm_patch.cursors import NULL_BLOCK_ID
from replayssm_patch.gdn_backend import ReplayGDNAttentionBackend, ReplayGDNAttentionMetadata
from replayssm_patch.gdn_state_layout import (
    RING_BETA,
    RING_G,
    RING_K,
    RING_U,
    RING_V,
    STATE_BF16,
    gdn_replay_state_dtypes,
    gdn_replay_state_shapes,
)

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's logger: same handler and level as its own lines

LAYER_NAME = QwenGatedDeltaNetAttention.__name__  # the PluggableLayer registry key vLLM looks up


class ReplayGatedDeltaNet(QwenGatedDeltaNetAttention):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replayssm = replayssm_config_of(get_current_vllm_config())
        if not self.replayssm.enable:
            # Registration is process-wide; a model built without the knob gets vLLM's exact layer.
            self.__class__ = QwenGatedDeltaNetAttention

    def get_kv_cache_spec(self, vllm_config: Any) -> MambaSpec:
        """vLLM's spec with the ring appended to every block's page (``get_state_shape``/``_dtype`` stay stock:
        vLLM's prefill warm-up unpacks ``get_state_dtype()`` as exactly (conv, ssm))."""
        spec = super().get_kv_cache_spec(vllm_config)
        assert isinstance(spec, MambaSpec)
        return replace(
            spec,
            shapes=gdn_replay_state_shapes(spec.shapes, self.replayssm, is_conv_state_dim_first()),
            dtypes=gdn_replay_state_dtypes(spec.dtypes, vllm_config.model_config.dtype, self.replayssm),
        )

    def get_attn_backend(self) -> type[ReplayGDNAttentionBackend]:
        return ReplayGDNAttentionBackend

    def _forward_core(
        self, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, core_attn_out: torch.Tensor
    ) -> None:
        raw = get_forward_context().attn_metadata
        metadata = raw.get(self.prefix) if isinstance(raw, dict) else None
        if metadata is None:  # profile run: vLLM's prefill-kernel warm-up
            super()._forward_core(mixed_qkv=mixed_qkv, b=b, a=a, core_attn_out=core_attn_out)
            return
        assert isinstance(metadata, ReplayGDNAttentionMetadata) and metadata.spec_sequence_masks is None
        if metadata.replay_native:  # the builder's small batches: the step is vLLM's own
            if metadata.num_prefills:
                self._materialise_prefill_rows(metadata)
            super()._forward_core(mixed_qkv=mixed_qkv, b=b, a=a, core_attn_out=core_attn_out)
            return
        if metadata.num_decodes:
            decode = self._replay_decode
            if metadata.num_prefills and self.replayssm.gdn_one_launch_mixed:
                decode = self._replay_mixed_decode  # eager: one launch instead of four
            decode(mixed_qkv, b, a, core_attn_out, metadata)
        if metadata.num_prefills:
            self._prefill(mixed_qkv, b, a, core_attn_out, metadata, raw)

    def _prefill(
        self,
        mixed_qkv: torch.Tensor,
        b: torch.Tensor,
        a: torch.Tensor,
        core_attn_out: torch.Tensor,
        metadata: ReplayGDNAttentionMetadata,
        raw: dict,
    ) -> None:
        """The step's prefill rows through vLLM's own path, reading checkpoints made current first.

        vLLM's layer reads its metadata from the forward context, so for this call the layer's entry is the
        prefill-only view and the tensors start at the first prefill token (decode rows come first).
        """
        self._materialise_prefill_rows(metadata)
        if metadata.prefill_view is None:  # no decode rows: the step is its own prefill view
            super()._forward_core(mixed_qkv=mixed_qkv, b=b, a=a, core_attn_out=core_attn_out)
        else:
            skip = metadata.num_decode_tokens
            raw[self.prefix] = metadata.prefill_view
            try:
                super()._forward_core(
                    mixed_qkv=mixed_qkv[skip:], b=b[skip:], a=a[skip:], core_attn_out=core_attn_out[skip:]
                )
            finally:
                raw[self.prefix] = metadata
        if self.replayssm.split_precision:  # vLLM's prefill wrote the masters only
            from replayssm_patch.kernels import copy_state_to_bf16

            assert metadata.prefill_state_indices is not None
            copy_state_to_bf16(self.kv_cache[1], self.kv_cache[STATE_BF16], metadata.prefill_state_indices,
                               pad_slot_id=None)  # eager: no pads  # fmt: skip

    def _materialise_prefill_rows(self, metadata: ReplayGDNAttentionMetadata) -> None:
        """Fold what the prefill rows' rings hold before vLLM's prefill reads their checkpoints."""
        assert metadata.prefill_state_indices is not None and metadata.replay_pending is not None
        if metadata.replay_fold_pending:  # the CPU knows when every prefill row is fresh: no fold launch then
            self.materialise(metadata.prefill_state_indices, metadata.replay_pending)

    def warm_eager_kernels(self) -> None:
        """Compile the kernels a step with prefills launches eagerly (the materialise fold and, with
        ``gdn_one_launch_mixed``, the one-launch decode) at start-up, not at the first such step while serving: one
        launch each on a row in vLLM's null block, which both skip, so no state changes."""
        from replayssm_patch.kernels import gdn_mixed_decode

        cache = self.kv_cache
        null = torch.full((1,), NULL_BLOCK_ID, dtype=torch.int32, device=cache[1].device)
        self.materialise(null, torch.zeros_like(null))
        if not self.replayssm.gdn_one_launch_mixed:
            return
        (k_heads, heads), dtype = self._local_heads(), self.conv1d.weight.dtype
        tokens = torch.zeros(1, self.conv_dim // self.tp_size, dtype=dtype, device=null.device)
        gates = torch.zeros(1, heads, dtype=dtype, device=null.device)
        gdn_mixed_decode(
            tokens, self._conv_state(), self._conv_weights(), self.conv1d.bias, gates, gates, self.A_log, self.dt_bias,
            cache[1], cache[RING_K], cache[RING_U], cache[RING_G], null, torch.zeros_like(null), torch.zeros_like(null),
            num_k_heads=k_heads, head_k_dim=self.head_k_dim, activation=self.activation,
            pad_slot_id=NULL_BLOCK_ID, out=torch.zeros(1, heads, self.head_v_dim, dtype=dtype, device=null.device),
            split=self._split_tensors(),
        )  # fmt: skip

    def materialise(self, slots: torch.Tensor, pending: torch.Tensor) -> None:
        """Fold ``pending`` ring entries of ``slots`` into the fp32 checkpoint so vLLM's own path (a prefill, or
        a native decode step) reads the current state."""
        from replayssm_patch.kernels import gdn_flush_ring

        cache = self.kv_cache
        gdn_flush_ring(cache[1], cache[RING_K], cache[RING_U], cache[RING_G], slots, pending, pad_slot_id=NULL_BLOCK_ID,
                       split=self._split_tensors())  # fmt: skip

    def _replay_decode(
        self,
        mixed_qkv: torch.Tensor,
        b: torch.Tensor,
        a: torch.Tensor,
        core_attn_out: torch.Tensor,
        metadata: ReplayGDNAttentionMetadata,
    ) -> None:
        """Decode rows through vLLM's conv update, then the replay step's three launches (CUDA graphs hold them in
        decode-only steps; see ``gdn_decode``)."""
        from replayssm_patch.kernels import gdn_decode_step
        from replayssm_patch.kernels.gdn_layout import split_packed_qkv

        assert metadata.replay_flush_rows is not None and metadata.replay_flush_count is not None
        n, slots = self._decode_rows(metadata)
        cache = self.kv_cache
        qkv = causal_conv1d_update(
            mixed_qkv[:n], self._conv_state(), self._conv_weights(), self.conv1d.bias, self.activation,
            conv_state_indices=slots, validate_data=False,
        )  # fmt: skip
        k_heads, v_heads = self._local_heads()
        q, k, v = split_packed_qkv(qkv, k_heads, self.head_k_dim, v_heads, self.head_v_dim)
        gdn_decode_step(
            q, k, v, a[:n], b[:n], self.A_log, self.dt_bias, cache[1], cache[RING_K], cache[RING_U], cache[RING_G],
            slots, metadata.replay_write_pos, metadata.replay_flush_len,
            flush_rows=metadata.replay_flush_rows, flush_count=metadata.replay_flush_count,
            scale=self.head_k_dim**-0.5, pad_slot_id=NULL_BLOCK_ID, out=core_attn_out[:n], split=self._split_tensors(),
        )  # fmt: skip

    def _replay_mixed_decode(
        self,
        mixed_qkv: torch.Tensor,
        b: torch.Tensor,
        a: torch.Tensor,
        core_attn_out: torch.Tensor,
        metadata: ReplayGDNAttentionMetadata,
    ) -> None:
        """Decode rows of a step with prefills: conv and replay step in one launch (``gdn_mixed_decode``), since the
        step runs eagerly and each launch is host time."""
        from replayssm_patch.kernels import gdn_mixed_decode

        n, slots = self._decode_rows(metadata)
        cache = self.kv_cache
        gdn_mixed_decode(
            mixed_qkv[:n], self._conv_state(), self._conv_weights(), self.conv1d.bias, a[:n], b[:n], self.A_log,
            self.dt_bias, cache[1], cache[RING_K], cache[RING_U], cache[RING_G], slots, metadata.replay_write_pos,
            metadata.replay_flush_len, num_k_heads=self._local_heads()[0], head_k_dim=self.head_k_dim,
            activation=self.activation, scale=self.head_k_dim**-0.5, pad_slot_id=NULL_BLOCK_ID,
            out=core_attn_out[:n], split=self._split_tensors(),
        )  # fmt: skip

    def _split_tensors(self) -> Any:
        """Split precision's copy, β and value rings (``kernels.GdnSplitTensors``), or None without it."""
        if not self.replayssm.split_precision:
            return None
        from replayssm_patch.kernels import GdnSplitTensors

        cache = self.kv_cache
        return GdnSplitTensors(state_bf16=cache[STATE_BF16], ring_beta=cache[RING_BETA], ring_v=cache[RING_V])

    def _decode_rows(self, metadata: ReplayGDNAttentionMetadata) -> tuple[int, torch.Tensor]:
        """How many decode rows the step replays, and their state slots (they come first)."""
        assert metadata.replay_write_pos is not None and metadata.replay_flush_len is not None
        assert metadata.non_spec_state_indices_tensor is not None
        n = metadata.replay_write_pos.shape[0]
        return n, metadata.non_spec_state_indices_tensor[:n]

    def _local_heads(self) -> tuple[int, int]:
        """Key and value heads of this tensor-parallel rank."""
        return self.num_k_heads // self.tp_size, self.num_v_heads // self.tp_size

    def _conv_state(self) -> torch.Tensor:
        """The conv state as vLLM's conv kernels take it: [slots, dim, width - 1]."""
        conv = self.kv_cache[0]
        return conv if is_conv_state_dim_first() else conv.transpose(-1, -2)

    def _conv_weights(self) -> torch.Tensor:
        return self.conv1d.weight.view(self.conv1d.weight.size(0), self.conv1d.weight.size(2))


def install_replay_gdn(config: ReplaySSMConfig) -> None:
    """Make vLLM build ``ReplayGatedDeltaNet`` wherever a model asks for ``QwenGatedDeltaNetAttention`` (once
    per process). Logs one line through vLLM's logger, which the harness's plugin check reads."""
    if op_registry_oot.get(LAYER_NAME) is not ReplayGatedDeltaNet:
        PluggableLayer.register_oot(ReplayGatedDeltaNet, name=LAYER_NAME)
        logger.info(
            "ReplaySSM active: %s layers replaced (buffer_len=%d, split_precision=%s)",
            LAYER_NAME, config.buffer_len, config.split_precision,
        )  # fmt: skip
