"""SSM-state policies (DESIGN §9-10): how much state memory a sequence holds and how many bytes a step moves.

baseline:  the full recurrent state is read and written every decode step, in fp32 or bf16.
replayssm: the checkpoint is read every decode step (the bf16 copy with split precision), plus the ring of
           the last m < L step inputs; one ring entry is written per step; the checkpoint is written only
           when the ring fills (every L steps), so its write cost is amortised over L steps.
Prefill chunks read and write the state once per chunk under both policies (the chunked scan).
Speculative decoding with k drafts (vLLM 0.24): baseline holds 1 + k full states per sequence and a verify
step writes one state per verified token; ReplaySSM's ring grows by k entries and a verify step appends one
entry per verified token. The drafter's own passes are not modelled: they cost the same in both arms.

The same accounting serves Mamba-2 and Gated DeltaNet layers; only the state size and the ring entry differ
(`RecurrentShape`). A GDN step reads its checkpoint once for both mat-vecs (S·k̂ and S·q̂), as a Mamba-2 step
reads its once for h·C. GDN ReplaySSM keeps an fp32 checkpoint, as the plugin does (its ring's u is computed from
the state it read, so a bf16 state would feed rounding into every fold); with split precision its replay reads a
bf16 copy and its ring also keeps β and the raw v, which the flush replays exactly on the master.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Literal

from harness.errors import UserError
from harness.sim.model_config import BF16_BYTES, FP32_BYTES, RecurrentShape

DTYPE_BYTES = {"float32": FP32_BYTES, "bfloat16": BF16_BYTES}


@dataclass(frozen=True)
class DecodeTraffic:
    """Bytes one decode step moves for one sequence in one recurrent layer, by part (flushes amortised)."""

    checkpoint_read: float
    checkpoint_write: float
    ring_read: float = 0.0
    ring_append: float = 0.0
    conv: float = 0.0  # the rolling conv window, read and written every step under both policies

    @property
    def total(self) -> float:
        return sum(astuple(self))


@dataclass(frozen=True)
class StatePolicy:
    name: Literal["baseline", "replayssm"] = "baseline"
    ssm_dtype: Literal["float32", "bfloat16"] = "float32"
    buffer_len: int = 16
    split_precision: bool = False

    def __post_init__(self) -> None:
        if self.name not in ("baseline", "replayssm"):
            raise UserError(f"unknown --policy {self.name!r}; choose baseline or replayssm")
        if self.ssm_dtype not in DTYPE_BYTES:
            raise UserError(f"unknown --ssm-dtype {self.ssm_dtype!r}; choose float32 or bfloat16")
        if self.buffer_len < 2:
            raise UserError(f"--buffer-len must be at least 2 (got {self.buffer_len}); the default is 16")
        if self.split_precision and (self.name != "replayssm" or self.ssm_dtype != "float32"):
            raise UserError(
                "--split-precision needs --policy replayssm and --ssm-dtype float32 "
                "(it keeps an fp32 master plus a bf16 copy)"
            )

    @property
    def label(self) -> str:
        """Short name for logs and result metadata, e.g. `replayssm-L16-fp32+bf16`."""
        dtype = "fp32" if self.ssm_dtype == "float32" else "bf16"
        if self.name == "baseline":
            return f"baseline-{dtype}"
        return f"replayssm-L{self.buffer_len}-{dtype}" + ("+bf16" if self.split_precision else "")

    def _state_bytes(self, rec: RecurrentShape) -> int:
        return rec.state_elements * DTYPE_BYTES[self.ssm_dtype]

    def _conv_bytes(self, rec: RecurrentShape) -> int:
        return rec.conv_elements * BF16_BYTES

    def memory_bytes_per_seq(self, rec: RecurrentShape | None, spec_tokens: int = 0) -> int:
        """Recurrent memory one running sequence holds, over all recurrent layers (k = `spec_tokens` drafts)."""
        if rec is None:
            return 0
        per_layer = self._state_bytes(rec) + self._conv_bytes(rec)
        if self.name == "baseline":
            per_layer += spec_tokens * self._state_bytes(rec)
        else:
            per_layer += (self.buffer_len + spec_tokens) * rec.step_input_bytes
            if self.split_precision:
                per_layer += rec.state_elements * BF16_BYTES + (self.buffer_len + spec_tokens) * rec.split_entry_bytes
        return rec.layers * per_layer

    def require_supported(self, rec: RecurrentShape | None) -> None:
        """Refuse what the plugin refuses on this model's recurrent layers (one clear line each)."""
        if rec is None or rec.kind != "gated_deltanet" or self.name != "replayssm":
            return
        if self.ssm_dtype != "float32":
            raise UserError(
                "ReplaySSM on a Gated DeltaNet model keeps an fp32 checkpoint (the ring's u is folded into it); "
                "use --ssm-dtype float32"
            )

    def decode_traffic(self, rec: RecurrentShape) -> DecodeTraffic:
        """Per-layer bytes of one decode step: baseline reads and writes the state; ReplaySSM reads the
        checkpoint, on average (L-1)/2 ring entries, appends one, and writes the checkpoint every L steps (split
        precision: its entries' extra part appended every step and read once, by the flush)."""
        state, conv = self._state_bytes(rec), 2 * self._conv_bytes(rec)
        if self.name == "baseline":
            return DecodeTraffic(checkpoint_read=state, checkpoint_write=state, conv=conv)
        length = self.buffer_len
        copy = rec.state_elements * BF16_BYTES if self.split_precision else 0
        extra = rec.split_entry_bytes if self.split_precision else 0
        return DecodeTraffic(
            # non-flush steps read the bf16 copy when there is one; the flush reads the master
            checkpoint_read=((length - 1) * copy + state) / length if copy else state,
            checkpoint_write=(state + copy) / length,
            ring_read=(length - 1) / 2 * rec.step_input_bytes + extra,
            ring_append=rec.step_input_bytes + extra,
            conv=conv,
        )

    def decode_bytes_per_seq(self, rec: RecurrentShape | None) -> float:
        """State bytes one decode step moves for one sequence, over all recurrent layers."""
        return 0.0 if rec is None else rec.layers * self.decode_traffic(rec).total

    def draft_bytes_per_token(self, rec: RecurrentShape | None) -> float:
        """Extra state bytes a verify step moves per draft token: a full state write (baseline), a ring entry."""
        if rec is None:
            return 0.0
        return rec.layers * (self._state_bytes(rec) if self.name == "baseline" else rec.step_input_bytes)

    def prefill_bytes_per_seq(self, rec: RecurrentShape | None) -> float:
        """State bytes one prefill chunk moves for one sequence: read and write the state once."""
        if rec is None:
            return 0.0
        return rec.layers * 2 * (self._state_bytes(rec) + self._conv_bytes(rec))
