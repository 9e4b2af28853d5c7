"""Cache layout of ReplaySSM (ring + optional bf16 copy) and the small shared helpers every kernel uses."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# vLLM marks padded batch rows (CUDA-graph padding) with slot -1; kernels also skip any negative slot.
PAD_SLOT_ID = -1


@dataclass(frozen=True)
class RingShapes:
    """Per-slot shapes and dtypes of the extra cache tensors one Mamba-2 layer needs (no slot dimension)."""

    ring_x: tuple[int, int, int]  # (nheads, L, head_dim), model dtype
    ring_B: tuple[int, int, int]  # (ngroups, L, d_state), model dtype
    ring_dt: tuple[int, int]  # (nheads, L), float32
    state_bf16: tuple[int, int, int] | None  # (nheads, head_dim, d_state), bfloat16; None without split
    ring_dt_dtype: torch.dtype = torch.float32
    state_bf16_dtype: torch.dtype = torch.bfloat16

    def nbytes(self, model_dtype: torch.dtype) -> int:
        """Bytes per slot of all extra tensors, for page-size bookkeeping."""
        item = torch.empty((), dtype=model_dtype).element_size()
        total = _numel(self.ring_x) * item + _numel(self.ring_B) * item + _numel(self.ring_dt) * 4
        if self.state_bf16 is not None:
            total += _numel(self.state_bf16) * 2
        return total


def ring_shapes(
    nheads: int, head_dim: int, ngroups: int, d_state: int, buffer_len: int, split_precision: bool
) -> RingShapes:
    """Shapes of the ring (buffer_len steps of post-conv x, B and softplus'ed dt) and the bf16 copy.

    Head (or group) before ring position, so one program's entries are one contiguous run: a head's x
    ring is L x head_dim consecutive values, its dt ring L consecutive floats (not L loads 4·H bytes apart).
    """
    if buffer_len < 1:
        raise ValueError(f"buffer_len must be >= 1, got {buffer_len}")
    if nheads % ngroups:
        raise ValueError(f"nheads ({nheads}) must be a multiple of ngroups ({ngroups})")
    return RingShapes(
        ring_x=(nheads, buffer_len, head_dim),
        ring_B=(ngroups, buffer_len, d_state),
        ring_dt=(nheads, buffer_len),
        state_bf16=(nheads, head_dim, d_state) if split_precision else None,
    )


@dataclass
class ReplayCache:
    """Dense ReplaySSM cache tensors of one layer for ``slots`` sequences (tests and benchmarks; inside vLLM
    the same tensors are views into the KV-cache pages)."""

    ssm_state: torch.Tensor  # [slots, nheads, head_dim, d_state] master checkpoint
    ring_x: torch.Tensor  # [slots, nheads, L, head_dim]
    ring_B: torch.Tensor  # [slots, ngroups, L, d_state]
    ring_dt: torch.Tensor  # [slots, nheads, L] float32
    state_bf16: torch.Tensor | None  # [slots, nheads, head_dim, d_state] bf16 copy, split precision only

    @classmethod
    def allocate(
        cls,
        slots: int,
        spec: RingShapes,
        *,
        model_dtype: torch.dtype,
        state_dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        ring_fill: float = 0.0,
    ) -> ReplayCache:
        """Zero checkpoints; rings filled with ``ring_fill`` (NaN simulates a reused slot's stale entries)."""
        nheads, _, head_dim = spec.ring_x
        d_state = spec.ring_B[2]
        return cls(
            ssm_state=torch.zeros(slots, nheads, head_dim, d_state, dtype=state_dtype, device=device),
            ring_x=torch.full((slots, *spec.ring_x), ring_fill, dtype=model_dtype, device=device),
            ring_B=torch.full((slots, *spec.ring_B), ring_fill, dtype=model_dtype, device=device),
            ring_dt=torch.full((slots, *spec.ring_dt), ring_fill, dtype=spec.ring_dt_dtype, device=device),
            state_bf16=None
            if spec.state_bf16 is None
            else torch.zeros(slots, *spec.state_bf16, dtype=spec.state_bf16_dtype, device=device),
        )

    def clone(self) -> ReplayCache:
        copy = None if self.state_bf16 is None else self.state_bf16.clone()
        return ReplayCache(self.ssm_state.clone(), self.ring_x.clone(), self.ring_B.clone(), self.ring_dt.clone(), copy)

    def set_checkpoint(self, slots: torch.Tensor, state: torch.Tensor) -> None:
        """Write checkpoints (as a prefill would) and their bf16 copies."""
        self.ssm_state[slots.long()] = state.to(self.ssm_state.dtype)
        if self.state_bf16 is not None:
            self.state_bf16[slots.long()] = state.to(self.state_bf16.dtype)


def ring_entries(ring: torch.Tensor) -> torch.Tensor:
    """A ring tensor ([slot, H or G, L, ...]) viewed as [slot, L, H or G, ...]: entry-major indexing for the
    PyTorch references and tests (a view, so writes through it land in the ring)."""
    return ring.transpose(1, 2)


def ring_len_of(ring_x: torch.Tensor) -> int:
    """L, the number of entries a ring holds (ring_x is [slots, nheads, L, head_dim])."""
    return ring_x.shape[2]


def decode_flush_len(write_pos: torch.Tensor, buffer_len: int) -> torch.Tensor:
    """flush_len for a plain decode step: buffer_len where this step fills the ring (write_pos == L-1), else 0."""
    return torch.where(write_pos == buffer_len - 1, buffer_len, 0).to(torch.int32)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


def valid_rows(state_indices: torch.Tensor, pad_slot_id: int) -> torch.Tensor:
    """Boolean mask of batch rows that hold a real sequence (not padding)."""
    return (state_indices != pad_slot_id) & (state_indices >= 0)


def group_of_head(nheads: int, ngroups: int, device: torch.device) -> torch.Tensor:
    """Index of the B/C group each head reads (vLLM convention: consecutive heads share a group)."""
    return torch.arange(nheads, device=device) // (nheads // ngroups)


def per_head(t: torch.Tensor | None, nheads: int) -> torch.Tensor | None:
    """Accept A / D / dt_bias either per head ([nheads]) or in vLLM's expanded form ([nheads, P(, N)])."""
    if t is None:
        return None
    while t.dim() > 1:
        t = t[..., 0]
    if t.shape != (nheads,):
        raise ValueError(f"expected a per-head tensor of {nheads} values, got shape {tuple(t.shape)}")
    return t


def per_head_dt(dt: torch.Tensor) -> torch.Tensor:
    """Accept dt as [batch, nheads] or vLLM's head_dim-expanded [batch, nheads, head_dim] (stride-0 view)."""
    return dt[..., 0] if dt.dim() == 3 else dt


def copy_state_to_bf16(
    ssm_state: torch.Tensor,
    state_bf16: torch.Tensor,
    state_indices: torch.Tensor,
    pad_slot_id: int | None = PAD_SLOT_ID,
) -> None:
    """Refresh the bf16 copy of the given slots from the master (call after a prefill wrote the master).

    Padding rows are skipped; that needs a data-dependent mask (a device sync). ``pad_slot_id=None`` says
    every row is real (vLLM's eager prefill steps are not padded) and copies without the mask or the sync.
    Call it outside CUDA graphs (prefill is never graph-captured in FULL_DECODE_ONLY mode).
    """
    slots = state_indices.reshape(-1).long()
    if pad_slot_id is not None:
        slots = slots[valid_rows(slots, pad_slot_id)]
    state_bf16[slots] = ssm_state[slots].to(state_bf16.dtype)
