"""One ReplaySSM decode step for a Mamba-2 layer: replay (append + y), then flush the rows whose ring is full."""

from __future__ import annotations

from collections.abc import Callable

import torch

from replayssm_patch.kernels.flush import flush_ring, flush_ring_reference
from replayssm_patch.kernels.layout import PAD_SLOT_ID
from replayssm_patch.kernels.replay_decode import replay_decode, replay_decode_reference


def _decode_step_with(
    replay: Callable[..., torch.Tensor], flush: Callable[..., None], name: str, doc: str
) -> Callable[..., torch.Tensor]:
    """The Triton step and its PyTorch twin are one sequence over different replay/flush implementations."""

    def decode_step(
        x: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        ssm_state: torch.Tensor,
        ring_x: torch.Tensor,
        ring_B: torch.Tensor,
        ring_dt: torch.Tensor,
        state_indices: torch.Tensor,
        write_pos: torch.Tensor,
        flush_len: torch.Tensor,
        *,
        state_bf16: torch.Tensor | None = None,
        D: torch.Tensor | None = None,
        dt_bias: torch.Tensor | None = None,
        dt_softplus: bool = True,
        pad_slot_id: int = PAD_SLOT_ID,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        read_state = state_bf16 if state_bf16 is not None else ssm_state
        out = replay(
            x, dt, A, B, C, read_state, ring_x, ring_B, ring_dt, state_indices, write_pos,
            D=D, dt_bias=dt_bias, dt_softplus=dt_softplus, pad_slot_id=pad_slot_id, out=out,
        )  # fmt: skip
        flush(
            ssm_state, ring_x, ring_B, ring_dt, A, state_indices, flush_len,
            state_bf16=state_bf16, pad_slot_id=pad_slot_id,
        )  # fmt: skip
        return out

    decode_step.__name__ = decode_step.__qualname__ = name
    decode_step.__doc__ = doc
    return decode_step


replay_decode_step = _decode_step_with(
    replay_decode,
    flush_ring,
    "replay_decode_step",
    """The whole decode step (Triton): y from ``replay_decode`` (reads state_bf16 when given, else
    ssm_state), then ``flush_ring`` folds rows with flush_len > 0 into ssm_state (+ state_bf16).

    Argument shapes as in ``replay_decode`` / ``flush_ring``. Two launches with fixed grids whatever the
    metadata says, so it can be captured in a CUDA graph. Returns y [batch, nheads, head_dim].
    """,
)
replay_decode_step_reference = _decode_step_with(
    replay_decode_reference,
    flush_ring_reference,
    "replay_decode_step_reference",
    "Plain-PyTorch twin of ``replay_decode_step`` (same arguments).",
)
