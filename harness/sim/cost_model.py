"""Step time of one engine step from a roofline of the model on a GPU, with fitted efficiency factors.

A step runs the weight GEMMs (bound by weight bytes or by FLOPs, whichever is slower: the roofline), then
the per-sequence memory traffic (KV reads, SSM-state reads and writes per policy), plus a fixed launch /
scheduling overhead and a small per-sequence host cost. Peak numbers come from the GPU table; the
efficiency factors and overheads are fitted to measured vLLM runs (`harness/sim/calibration.py`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import UserError
from harness.sim.gpus import Gpu
from harness.sim.model_config import BF16_BYTES, ModelShape
from harness.sim.state_policy import StatePolicy

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_FACTORS_PATH = REPO_ROOT / "configs" / "calibration" / "fitted-h200-nemotron-h-8b.json"


@dataclass(frozen=True)
class StepWork:
    """What one scheduled step computes; filled in by the scheduler."""

    decode_seqs: int = 0
    prefill_seqs: int = 0
    prefill_tokens: int = 0
    context_tokens: int = 0  # KV tokens attention reads (sum of every scheduled sequence's context)
    attention_pairs: int = 0  # sum over new tokens of the context each attends to
    draft_tokens: int = 0  # speculative drafts verified alongside the decodes (k per decode)

    @property
    def tokens(self) -> int:
        return self.decode_seqs + self.draft_tokens + self.prefill_tokens

    @property
    def seqs(self) -> int:
        return self.decode_seqs + self.prefill_seqs


@dataclass(frozen=True)
class StepFeatures:
    """Peak-rate times (seconds) of the parts of one step, before efficiency factors."""

    weights_s: float
    flops_s: float
    traffic_s: float
    seqs: int
    comm_s: float = 0.0  # tensor-parallel all-reduces, at peak interconnect bandwidth (not fitted)


@dataclass(frozen=True)
class FittedFactors:
    """Efficiency factors and overheads fitted to a calibration file (see `calibration.py`)."""

    overhead_s: float = 1.0e-3
    per_seq_s: float = 10e-6
    weight_bw_eff: float = 0.85
    traffic_bw_eff: float = 0.85
    flop_eff: float = 0.5
    memory_reserve_bytes: int = 2 << 30  # activations, CUDA graphs, allocator slack outside the KV/state pool

    def combine(self, weights_s: Any, flops_s: Any, traffic_s: Any, seqs: Any, comm_s: Any = 0.0) -> Any:
        """Step seconds from peak-rate parts; works on floats and on numpy arrays (used by the fit)."""
        gemm = np.maximum(weights_s / self.weight_bw_eff, flops_s / self.flop_eff)
        return self.overhead_s + self.per_seq_s * seqs + gemm + traffic_s / self.traffic_bw_eff + comm_s

    def to_json(self) -> dict[str, float]:
        return asdict(self)


def load_factors(path: str | os.PathLike[str] | None = None) -> FittedFactors:
    """Read fitted factors (`factors` key of a file written by `replaybench sim-calibrate`)."""
    path = Path(path) if path else DEFAULT_FACTORS_PATH
    try:
        payload = json.loads(path.read_text())
        return FittedFactors(**payload["factors"])
    except FileNotFoundError:
        raise UserError(
            f"{path}: no fitted cost-model factors; run `replaybench sim-calibrate` or give --calibration FILE"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a fitted-factors file ({exc}); re-run `replaybench sim-calibrate`") from None


class CostModel:
    """Maps a step's work to its duration for one model, GPU (x tensor-parallel size) and state policy.

    Tensor parallelism splits weights, FLOPs, KV and state evenly over `tp` GPUs and adds two ring
    all-reduces of the hidden state per layer (after the mixer and after the MLP).
    """

    def __init__(self, shape: ModelShape, gpu: Gpu, policy: StatePolicy, factors: FittedFactors, tp: int = 1) -> None:
        self.shape, self.gpu, self.policy, self.factors, self.tp = shape, gpu, policy, factors, tp
        layers = shape.attention.layers + (shape.recurrent.layers if shape.recurrent else 0) + shape.mlp.layers
        ring = 2 * (tp - 1) / tp
        self._allreduce_s_per_token = layers * shape.hidden * BF16_BYTES * ring / gpu.interconnect_bandwidth
        attention = shape.attention
        self._attention_flops_per_pair = 4 * attention.layers * attention.heads * attention.head_dim
        self._decode_state_bytes = policy.decode_bytes_per_seq(shape.recurrent)
        self._draft_state_bytes = policy.draft_bytes_per_token(shape.recurrent)
        self._prefill_state_bytes = policy.prefill_bytes_per_seq(shape.recurrent)

    def features(self, work: StepWork) -> StepFeatures:
        shape, gpu = self.shape, self.gpu
        flops = (
            2.0 * shape.active_params_per_token * work.tokens + self._attention_flops_per_pair * work.attention_pairs
        )
        traffic = (
            work.context_tokens * shape.kv_bytes_per_token
            + work.decode_seqs * self._decode_state_bytes
            + work.draft_tokens * self._draft_state_bytes
            + work.prefill_seqs * self._prefill_state_bytes
        )
        per_gpu_bandwidth = gpu.memory_bandwidth * self.tp
        return StepFeatures(
            weights_s=shape.weight_bytes_read(work.tokens) / per_gpu_bandwidth,
            flops_s=flops / (gpu.bf16_flops * self.tp),
            traffic_s=traffic / per_gpu_bandwidth,
            seqs=work.seqs,
            comm_s=work.tokens * self._allreduce_s_per_token,
        )

    def step_time(self, work: StepWork) -> float:
        f = self.features(work)
        return float(self.factors.combine(f.weights_s, f.flops_s, f.traffic_s, f.seqs, f.comm_s))

    def pool_bytes(self, gpu_memory_utilization: float) -> int:
        """Memory left for KV blocks and SSM state over all `tp` GPUs, as vLLM computes it at start-up."""
        per_gpu = int(self.gpu.memory_bytes * gpu_memory_utilization) - self.factors.memory_reserve_bytes
        return self.tp * per_gpu - self.shape.weight_bytes
