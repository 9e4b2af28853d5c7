"""`EngineSpec`: everything that defines one simulated engine, and how to build it from command-line values."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import UserError
from harness.sim.cost_model import CostModel, FittedFactors, load_factors
from harness.sim.gpus import Gpu, get_gpu
from harness.sim.model_config import ModelShape, load_model_shape
from harness.sim.scheduler import SchedulerLimits
from harness.sim.speculation import Speculation
from harness.sim.state_policy import StatePolicy


@dataclass(frozen=True)
class EngineSpec:
    shape: ModelShape
    gpu: Gpu
    policy: StatePolicy
    factors: FittedFactors
    limits: SchedulerLimits = field(default_factory=SchedulerLimits)
    max_model_len: int = 4096
    gpu_memory_utilization: float = 0.85
    block_tokens: int = 16
    tensor_parallel_size: int = 1
    speculation: Speculation | None = None

    @property
    def spec_tokens(self) -> int:
        """Drafts verified per decode step (0 without speculative decoding)."""
        return self.speculation.tokens if self.speculation else 0

    def cost_model(self) -> CostModel:
        return CostModel(self.shape, self.gpu, self.policy, self.factors, self.tensor_parallel_size)


def build_spec(
    model_config: str | Path,
    gpu: str,
    policy: StatePolicy,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
    max_model_len: int | None = None,
    calibration: Path | None = None,
    tensor_parallel_size: int = 1,
    speculation: Speculation | None = None,
) -> EngineSpec:
    """Validate user-given engine settings; every bad value is a one-line `UserError` naming the fix."""
    if max_num_seqs < 1:
        raise UserError(f"--max-num-seqs must be at least 1 (got {max_num_seqs}); vLLM's default is 256")
    if max_num_batched_tokens < 1:
        raise UserError(f"--max-num-batched-tokens must be at least 1 (got {max_num_batched_tokens}); try 8192")
    if tensor_parallel_size not in (1, 2, 4, 8):
        raise UserError(f"--tensor-parallel-size must be 1, 2, 4 or 8 (got {tensor_parallel_size})")
    shape = load_model_shape(model_config)
    policy.require_supported(shape.recurrent)
    length = max_model_len or shape.max_model_len
    if length < 2:
        raise UserError(f"--max-model-len must be at least 2 (got {length})")
    spec = EngineSpec(
        shape=shape,
        gpu=get_gpu(gpu),
        policy=policy,
        factors=load_factors(calibration),
        limits=SchedulerLimits(max_num_seqs, max_num_batched_tokens),
        max_model_len=length,
        tensor_parallel_size=tensor_parallel_size,
        speculation=speculation,
    )
    _require_memory_left(spec)
    return spec


def _require_memory_left(spec: EngineSpec) -> None:
    """The weights must leave room for KV blocks and SSM state on the GPUs given."""
    if spec.cost_model().pool_bytes(spec.gpu_memory_utilization) <= 0:
        gib = 1 << 30
        offered = spec.tensor_parallel_size * spec.gpu.memory_bytes * spec.gpu_memory_utilization / gib
        raise UserError(
            f"{spec.shape.name} needs {spec.shape.weight_bytes / gib:.0f} GiB of bf16 weights but "
            f"{spec.tensor_parallel_size} x {spec.gpu.name} offer {offered:.0f} GiB for the whole "
            "engine; raise --tensor-parallel-size or choose a bigger --gpu"
        )
