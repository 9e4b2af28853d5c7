"""The GDN kernel bench's shared setup: the Qwen3.5-4B layer's shapes and swept launch shapes, vLLM's packed decode
as the baseline call, a step's packed inputs, paged state tensors and the traffic model.

Kept apart from ``gdn_kernel_bench`` (the sections that run and report) as ``mamba_bench_setup`` is from the Mamba-2
bench: what a problem is, not how it is measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from replayssm_patch.gpu.bench_common import BenchPlan, VllmBaseline, paged_tensors

if TYPE_CHECKING:  # torch and the kernels are imported lazily: TRITON_INTERPRET must be decided first
    import torch

    from replayssm_patch.kernels.gdn_synthetic import GdnLayerParams

CONV_WIDTH = 4  # Qwen3.5's conv kernel: vLLM keeps its last 3 inputs per channel


@dataclass(frozen=True)
class Plan(BenchPlan):
    """The Qwen3.5-4B GDN layer's shapes and the launch shapes swept, beside the common effort."""

    num_k_heads: int = 16
    num_v_heads: int = 32
    head_k_dim: int = 128
    head_v_dim: int = 128
    # (block_v, num_warps[, mma_stages]) of the replay: CUDA-core sums, then (session 25) the checkpoint products on
    # the tensor cores around the Mamba-2 verify's winner, 32 rows x 1 warp x 3 stages (ptxas: 123 registers; 16 x 1:
    # 79; 32 x 2: 80; 64 x 2: 121; no spills)
    replay_shapes: tuple[tuple[int, ...], ...] = (
        *((v, w) for v in (16, 32, 64) for w in (2, 4, 8)), (32, 1, 3), (32, 1, 2), (16, 1, 3), (32, 2, 3), (64, 2, 3),
    )  # fmt: skip
    # (block_v, num_warps[, maxnreg, programs per SM]) of the fold; session 25: the listed grid sized to what an SM
    # holds (16 x 4 capped at 128 registers: 4, no spills; 8 warps at 110-128 registers: 2, where the grid had 3)
    fold_shapes: tuple[tuple[int, ...], ...] = (
        (16, 4), (16, 8), (32, 4), (32, 8), (16, 4, 128, 4), (16, 8, 0, 2), (32, 8, 0, 2),
    )  # fmt: skip
    # (block_v, num_warps, programs per SM) of split precision's fold, a chain of dependent steps per item (session
    # 27: 74 µs of the split step at 256 with the fp32 fold's 16 x 4 warps, 4 an SM): smaller programs, more resident
    split_fold_shapes: tuple[tuple[int, int, int], ...] = (
        (16, 4, 4), (16, 2, 8), (16, 1, 16), (32, 2, 8), (8, 2, 8), (8, 1, 16), (8, 1, 32), (4, 1, 32),
    )  # fmt: skip

    @property
    def conv_dim(self) -> int:
        """Channels of the packed q|k|v the causal conv runs over."""
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    def split_qkv(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v heads as views of a packed [rows, q|k|v] tensor of this plan's shapes."""
        from replayssm_patch.kernels.gdn_layout import split_packed_qkv

        return split_packed_qkv(qkv, self.num_k_heads, self.head_k_dim, self.num_v_heads, self.head_v_dim)

    @property
    def qwen35_blocks(self) -> bool:
        """Whether compile_check's GDN block sizes (head dims 128, L 16) are this plan's, so its spill check holds."""
        return (self.head_k_dim, self.head_v_dim, self.buffer_len) == (128, 128, 16)


@dataclass(frozen=True)
class Baseline(VllmBaseline):
    """vLLM's packed GDN decode if importable, else None (the fp64 recurrence stands in for equivalence)."""

    SOURCE = ("vllm.model_executor.layers.fla.ops.fused_recurrent", "fused_recurrent_gated_delta_rule_packed_decode",
              "packed GDN decode")  # fmt: skip

    def step(
        self, state: torch.Tensor, batch: PackedInputs, layer: GdnLayerParams, indices: torch.Tensor,
        out: torch.Tensor,
    ) -> None:  # fmt: skip
        """One decode step as vLLM's layer runs it: packed q|k|v, a and b in the model dtype, in-kernel l2 norm,
        the state advanced in place; rows whose index is <= 0 are skipped (their out set to 0)."""
        assert self.fn is not None
        scale = batch.q.shape[2] ** -0.5
        self.fn(
            batch.mixed, batch.a, batch.b, layer.A_log, layer.dt_bias, scale, state, out.unsqueeze(1), indices,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip

    def probe(self, plan: Plan, device: str) -> tuple[Callable[[], Any], Callable[[], float]]:
        """A 2-row step (rows 1 and 2 of three states; row 0 is vLLM's null block) from random states."""
        import torch

        from replayssm_patch.kernels.gdn_ground_truth import gdn_recurrence_step
        from replayssm_patch.kernels.gdn_synthetic import GdnLayerParams

        gen = torch.Generator(device).manual_seed(0)
        layer = GdnLayerParams.random(plan.num_v_heads, gen, device)
        batch = PackedInputs.random(plan, 2, layer, gen)
        state = torch.randn(3, *state_shape(plan), generator=gen, device=device)
        expected_state = state[1:].double()
        out = torch.full(batch.v.shape, math.nan, device=device)
        rows = torch.arange(1, 3, dtype=torch.int32, device=device)

        def error() -> float:
            return relative_error(out, gdn_recurrence_step(expected_state, *batch.fields(), layer.A_log, layer.dt_bias))

        return lambda: self.step(state, batch, layer, rows, out), error


@dataclass(frozen=True)
class PackedInputs:
    """One step's inputs as vLLM's layer holds them: q, k, v are views into one packed [batch, q|k|v] tensor."""

    mixed: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor

    @classmethod
    def random(cls, plan: Plan, batch: int, layer: GdnLayerParams, gen: torch.Generator) -> PackedInputs:
        """``GdnStepInputs.random`` (realistic gates) in bf16, packed; a and b in bf16 too on the GPU, as vLLM
        hands them. On the CPU they stay fp32: Triton's interpreter truncates σ(b) to bf16 where the GPU and
        torch round it to nearest, an interpreter-only difference of one bf16 ulp in β (see the GDN tests)."""
        import torch

        from replayssm_patch.kernels.gdn_synthetic import GdnStepInputs

        gates = torch.bfloat16 if layer.A_log.is_cuda else torch.float32
        step = GdnStepInputs.random(
            batch, plan.num_k_heads, plan.head_k_dim, plan.head_v_dim, layer, gen, torch.bfloat16, gate_dtype=gates
        )
        mixed = torch.cat([step.q.flatten(1), step.k.flatten(1), step.v.flatten(1)], dim=1)
        return cls(mixed, *plan.split_qkv(mixed), step.a, step.b)

    def fields(self) -> tuple[torch.Tensor, ...]:
        """q, k, v, a, b: the per-step arguments of ``gdn_decode_step`` and ``gdn_recurrence_step``."""
        return self.q, self.k, self.v, self.a, self.b

    def rows(self, index: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(t[index] for t in self.fields())


def state_shape(plan: Plan) -> tuple[int, int, int]:
    return plan.num_v_heads, plan.head_v_dim, plan.head_k_dim


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|."""
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


def paged_gdn_tensors(plan: Plan, slots: int, replay: bool, device: str, split: bool = False) -> list[torch.Tensor]:
    """A GDN layer's state tensors (conv, ssm, then with ``replay`` ring_k, ring_u, ring_g, and with ``split``
    ring_beta, ring_v and the bf16 copy) as views into one page per slot, shapes and dtypes from the plugin's own
    MambaSpec functions."""
    import torch

    from replayssm_patch.config import ReplaySSMConfig
    from replayssm_patch.gdn_state_layout import gdn_replay_state_dtypes, gdn_replay_state_shapes

    shapes: tuple[tuple[int, ...], ...] = ((plan.conv_dim, CONV_WIDTH - 1), state_shape(plan))
    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float32)
    if replay:
        config = ReplaySSMConfig(enable=True, buffer_len=plan.buffer_len, split_precision=split)
        shapes = gdn_replay_state_shapes(shapes, config, True)
        dtypes = gdn_replay_state_dtypes(dtypes, torch.bfloat16, config)
    return paged_tensors(shapes, dtypes, slots, device)


@dataclass(frozen=True)
class TrafficModel:
    """Bytes each call must move from/to HBM: bf16 activations and gates, fp32 state and ring, in split precision the
    bf16 copy read instead and the β and raw-v entries (the coefficient launch's scratch, ~1% of a row's state, is
    left out)."""

    plan: Plan
    batch: int

    @property
    def _state_bytes(self) -> int:  # fp32 [HV, V, K] per row
        return self.batch * math.prod(state_shape(self.plan)) * 4

    @property
    def _key_entry_bytes(self) -> int:  # one ring entry's k̂ of one row
        return self.plan.num_k_heads * self.plan.head_k_dim * 4

    @property
    def _entry_bytes(self) -> int:  # one ring entry of one row: k̂, u, g
        p = self.plan
        return self._key_entry_bytes + p.num_v_heads * (p.head_v_dim + 1) * 4

    @property
    def _io_bytes(self) -> int:  # q, k, v, a, b in, o out
        p = self.plan
        per_row = 2 * p.num_k_heads * p.head_k_dim + 2 * p.num_v_heads * p.head_v_dim + 2 * p.num_v_heads
        return self.batch * 2 * per_row

    def baseline(self) -> float:
        return self._io_bytes + 2 * self._state_bytes

    @property
    def _split_entry_bytes(self) -> int:  # what split precision adds to one ring entry of one row: β, raw v (bf16)
        p = self.plan
        return p.num_v_heads * (4 + 2 * p.head_v_dim)

    def replay(self, split: bool = False) -> float:
        """The checkpoint (or its bf16 copy) read, the earlier entries read, this step's appended."""
        earlier = (self.plan.buffer_len - 1) / 2  # mean ring entries read with staggered cursors
        entries = self.batch * (earlier + 1) * self._entry_bytes + (
            self.batch * self._split_entry_bytes if split else 0
        )
        return self._io_bytes + self._state_bytes / (2 if split else 1) + entries

    def fold(self, share: float, split: bool = False) -> float:
        """What flushing rows add to a replay: the new checkpoint written and their ring of keys read again; in split
        precision the master read and written, the copy written, the window's k̂, g, β and v read."""
        L, rows = self.plan.buffer_len, share * self.batch
        if not split:
            return share * self._state_bytes + rows * L * self._key_entry_bytes
        window = self._key_entry_bytes + self._split_entry_bytes + 4 * self.plan.num_v_heads
        # the master read and written and the copy written, less the copy read the replay's term counts for them
        return share * self._state_bytes * 2 + rows * L * window

    def conv(self) -> float:
        """What the causal conv inside the one-launch kernel adds: each channel's conv state read and shifted (bf16)."""
        return self.batch * self.plan.conv_dim * (CONV_WIDTH - 1) * 2 * 2

    def aligned(self) -> float:
        """Every row at write_pos L-1, all flushing: full rings read, the state read and written, keys read twice."""
        L = self.plan.buffer_len
        return self._io_bytes + 2 * self._state_bytes + self.batch * L * (self._entry_bytes + self._key_entry_bytes)
