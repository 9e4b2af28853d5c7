"""The Mamba-2 layer with ReplaySSM state management (vLLM ``MambaMixer2`` out-of-tree replacement).

Decode rows (all of a CUDA-graph step, the first rows of a mixed one) run vLLM's causal-conv update, then
the ReplaySSM decode step: append x/B/dt to the ring, answer from checkpoint + ring, and fold the ring
into the checkpoint on the step that fills it. Prefill rows first fold whatever their ring still holds
(materialise-before-prefill; only a sequence that decoded before has any), then run vLLM's own path,
which leaves their checkpoint current; with split precision their bf16 copy is refreshed afterwards.
Decode rows never fold early because a prefill shares their step: under steady traffic nearly every step
holds one, and folding every ring each step would cost more than vLLM's own decode.
At the builder's native batches (``backend.plan_ring``) the whole step is vLLM's own path on the checkpoint, which
the builder made current; the ring is not used.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import torch
from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.custom_op import PluggableLayer, op_registry_oot
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update
from vllm.v1.kv_cache_interface import MambaSpec

from replayssm_patch.backend import ReplayMamba2AttentionBackend, ReplayMamba2AttentionMetadata
from replayssm_patch.config import ReplaySSMConfig, replayssm_config_of, verify_len_of
from replayssm_patch.cursors import NULL_BLOCK_ID
from replayssm_patch.state_layout import RING_B, RING_DT, RING_X, STATE_BF16, replay_state_dtypes, replay_state_shapes

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's logger: same handler and level as its own lines


class ReplayMambaMixer2(MambaMixer2):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replayssm = replayssm_config_of(get_current_vllm_config())
        if not self.replayssm.enable:
            # Registration is process-wide; a model built without the knob gets vLLM's exact layer.
            self.__class__ = MambaMixer2

    def get_kv_cache_spec(self, vllm_config: Any) -> MambaSpec:
        """vLLM's spec with the ring (and bf16 copy) appended to every block's page.

        Extended here and not in ``get_state_shape``/``get_state_dtype``: vLLM's own layer code unpacks
        those as exactly (conv, ssm) (its SSD warm-up in the profile run does), so they stay stock.
        """
        spec = super().get_kv_cache_spec(vllm_config)
        assert isinstance(spec, MambaSpec) and self.model_config is not None
        verify_len = verify_len_of(vllm_config)
        return replace(
            spec,
            shapes=replay_state_shapes(spec.shapes, self.replayssm, is_conv_state_dim_first(), verify_len),
            dtypes=replay_state_dtypes(spec.dtypes, self.model_config.dtype, self.replayssm),
            num_speculative_blocks=0,  # one block per request: a rollback is a cursor move, not a state copy
        )

    def get_attn_backend(self) -> type[ReplayMamba2AttentionBackend]:
        return ReplayMamba2AttentionBackend

    def conv_ssm_forward(self, projected_states: torch.Tensor, output: torch.Tensor) -> None:
        raw = get_forward_context().attn_metadata
        metadata = raw[self.prefix] if isinstance(raw, dict) else None
        if metadata is None:  # profile run: vLLM's warm-up path
            super().conv_ssm_forward(projected_states=projected_states, output=output)
            return
        assert isinstance(metadata, ReplayMamba2AttentionMetadata)
        if metadata.replay_native:  # the builder's small batches: the step is vLLM's own
            if metadata.num_prefills:
                self._materialise_prefill_rows(metadata)
            super().conv_ssm_forward(projected_states=projected_states, output=output)
            return
        if metadata.num_decodes and metadata.replay_fold_len is not None:
            self._replay_verify(projected_states, output, metadata)
        elif metadata.num_decodes:
            self._replay_decode(projected_states, output, metadata)
        if metadata.num_prefills:
            self._prefill(projected_states, output, metadata, raw)

    def _prefill(
        self, projected_states: torch.Tensor, output: torch.Tensor, metadata: ReplayMamba2AttentionMetadata, raw: dict
    ) -> None:
        """The step's prefill rows through vLLM's own path, reading checkpoints made current first.

        vLLM's layer reads its metadata from the forward context, so for this call the layer's entry says
        "no decode rows" and the tensors start at the first prefill token (decode rows come first).
        """
        slots = self._materialise_prefill_rows(metadata)
        skip = metadata.num_decode_tokens
        raw[self.prefix] = replace(metadata, num_decodes=0, num_decode_tokens=0)
        try:
            super().conv_ssm_forward(projected_states=projected_states[skip:], output=output[skip:])
        finally:
            raw[self.prefix] = metadata
        if self.replayssm.split_precision:
            from replayssm_patch.kernels import copy_state_to_bf16

            copy_state_to_bf16(self.kv_cache[1], self.kv_cache[STATE_BF16], slots, pad_slot_id=None)  # eager: no pads

    def _materialise_prefill_rows(self, metadata: ReplayMamba2AttentionMetadata) -> torch.Tensor:
        """Fold what the prefill rows' rings hold before vLLM's prefill reads their checkpoints; their slots."""
        slots = metadata.state_indices_tensor_p.to(torch.int32)
        if metadata.replay_fold_pending:  # the CPU knows when every prefill row is fresh: no fold launch then
            self.materialise(slots, metadata.replay_pending)
        return slots

    def warm_eager_kernels(self) -> None:
        """Compile the materialise fold now, at start-up, not at the first continuing chunked prefill while
        serving (vLLM's JIT monitor named ``_flush_kernel`` mid-run on the H200): one launch on vLLM's null
        block, a row the kernel skips, so no state changes."""
        null = torch.full((1,), NULL_BLOCK_ID, dtype=torch.int32, device=self.kv_cache[1].device)
        self.materialise(null, torch.zeros_like(null))

    def materialise(self, slots: torch.Tensor, pending: torch.Tensor | None) -> None:
        """Fold pending ring entries into the fp32 checkpoint so vLLM's own path (a prefill, or a native decode
        step) reads the current state."""
        from replayssm_patch.kernels import flush_ring

        assert pending is not None
        cache = self.kv_cache
        flush_ring(
            cache[1], cache[RING_X], cache[RING_B], cache[RING_DT], self.A, slots, pending, pad_slot_id=NULL_BLOCK_ID
        )

    def _decode_conv(
        self, projected_states: torch.Tensor, metadata: ReplayMamba2AttentionMetadata, max_query_len: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """vLLM's causal-conv update of the decode tokens (shifted by num_accepted_tokens under speculation);
        returns their x [tokens, heads, head_dim], B and C [tokens, groups, d_state] and raw dt."""
        n = metadata.num_decode_tokens
        hidden_states_B_C, dt = torch.split(
            projected_states[:n, self.tped_intermediate_size :], [self.tped_conv_size, self.tped_dt_size], dim=-1
        )
        cache = self.kv_cache
        conv_state = cache[0] if is_conv_state_dim_first() else cache[0].transpose(-1, -2)
        hidden_states_B_C = causal_conv1d_update(
            hidden_states_B_C,
            conv_state,
            self.conv_weights,
            self.conv1d.bias,
            self.activation,
            conv_state_indices=metadata.state_indices_tensor_d,
            num_accepted_tokens=metadata.num_accepted_tokens,
            query_start_loc=metadata.query_start_loc_d,
            max_query_len=max_query_len,
        )
        x, B, C = self.split_hidden_states_B_C_fn(hidden_states_B_C)
        heads, groups = self.num_heads // self.tp_size, self.n_groups // self.tp_size
        shape = (n, groups, self.ssm_state_size)
        return x.view(n, heads, self.head_dim), B.view(shape), C.view(shape), dt

    def _kernel_arguments(
        self, x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor, C: torch.Tensor, out: torch.Tensor
    ) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
        """The leading arguments and the keywords the decode and verify steps share."""
        cache = self.kv_cache
        leading = (x, dt, self.A, B, C, cache[1], cache[RING_X], cache[RING_B], cache[RING_DT])
        keywords = {
            "state_bf16": cache[STATE_BF16] if self.replayssm.split_precision else None,
            "D": self.D,
            "dt_bias": self.dt_bias,
            "dt_softplus": True,
            "pad_slot_id": NULL_BLOCK_ID,
            "out": out,
        }
        return leading, keywords

    def _replay_decode(
        self, projected_states: torch.Tensor, output: torch.Tensor, metadata: ReplayMamba2AttentionMetadata
    ) -> None:
        from replayssm_patch.kernels import replay_decode_step

        n = metadata.num_decode_tokens
        x, B, C, dt = self._decode_conv(projected_states, metadata, metadata.state_indices_tensor_d.size(-1))
        leading, keywords = self._kernel_arguments(x, dt, B, C, output[:n].view(x.shape))
        plan = (metadata.state_indices_tensor_d[:n, 0], metadata.replay_write_pos[:n], metadata.replay_flush_len[:n])
        fold_list = {"flush_rows": metadata.replay_flush_rows[:n], "flush_count": metadata.replay_flush_count}
        replay_decode_step(*leading, *plan, **fold_list, **keywords)

    def _replay_verify(
        self, projected_states: torch.Tensor, output: torch.Tensor, metadata: ReplayMamba2AttentionMetadata
    ) -> None:
        """Speculative decode rows: fold rows whose history would overflow, then all 1+k tokens of every row from
        one checkpoint read. ``max_query_len`` is 1+k, passed explicitly: vLLM's own layer reads it from the width
        of its state indices, which is 1 here (num_speculative_blocks = 0)."""
        from replayssm_patch.kernels import replay_verify_step

        n, rows = metadata.num_decode_tokens, metadata.state_indices_tensor_d.shape[0]
        max_query_len = 1 + self.num_spec
        x, B, C, dt = self._decode_conv(projected_states, metadata, max_query_len)
        leading, keywords = self._kernel_arguments(x, dt, B, C, output[:n].view(x.shape))
        plan = (
            metadata.state_indices_tensor_d[:, 0],
            metadata.replay_write_pos[:rows],
            metadata.replay_fold_len[:rows],
        )
        fold_list = (metadata.replay_flush_rows[:rows], metadata.replay_flush_count)
        replay_verify_step(*leading, *plan, metadata.query_start_loc_d, max_query_len, fold_list=fold_list, **keywords)


def install_replay_mixer(config: ReplaySSMConfig) -> None:
    """Make vLLM build ``ReplayMambaMixer2`` wherever a model asks for ``MambaMixer2`` (once per process).

    Logs one line through vLLM's logger, so the server log proves the plugin is active (the command line
    naming ``replayssm`` in --additional-config does not: vLLM ignores config keys nobody reads).
    """
    if op_registry_oot.get(MambaMixer2.__name__) is not ReplayMambaMixer2:
        PluggableLayer.register_oot(ReplayMambaMixer2, name=MambaMixer2.__name__)
        logger.info(
            "ReplaySSM active: MambaMixer2 layers replaced (buffer_len=%d, split_precision=%s)",
            config.buffer_len,
            config.split_precision,
        )
