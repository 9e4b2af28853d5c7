"""Random Gated DeltaNet layer parameters and decode-step inputs with realistic gates, for tests and benchmarks.

Realistic here means per-step log-decays g in [-0.1, -1e-3] (decays 0.90 .. 0.999) and write strengths
β in (0.05, 0.95). Dummy-weight models have A_log ~ 0 and dt_bias ~ 0, so g ~ -0.69 (the state halves every
step), which forgets the checkpoint within a few steps and would hide checkpoint and decay errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

LOG_DECAY_RANGE = (-0.1, -1e-3)
BETA_RANGE = (0.05, 0.95)


@dataclass(frozen=True)
class GdnLayerParams:
    """Per-value-head A_log and dt_bias of one GDN layer (fp32)."""

    A_log: torch.Tensor
    dt_bias: torch.Tensor

    @classmethod
    def random(cls, num_v_heads: int, gen: torch.Generator, device: torch.device | str = "cpu") -> GdnLayerParams:
        """e^A_log log-uniform in [0.01, 0.1]; dt_bias uniform in [-0.5, 0.5]."""
        uniform = torch.rand(2, num_v_heads, generator=gen, device=device)
        return cls(A_log=math.log(0.01) + uniform[0] * math.log(10.0), dt_bias=uniform[1] - 0.5)


@dataclass(frozen=True)
class GdnStepInputs:
    """One decode step's post-conv q, k, v (model dtype) and raw gate inputs a, b (``gate_dtype``)."""

    q: torch.Tensor  # [batch, num_k_heads, head_k_dim]
    k: torch.Tensor  # [batch, num_k_heads, head_k_dim]
    v: torch.Tensor  # [batch, num_v_heads, head_v_dim]
    a: torch.Tensor  # [batch, num_v_heads]
    b: torch.Tensor  # [batch, num_v_heads]

    @classmethod
    def random(
        cls,
        batch: int,
        num_k_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        layer: GdnLayerParams,
        gen: torch.Generator,
        dtype: torch.dtype,
        gate_dtype: torch.dtype = torch.float32,
    ) -> GdnStepInputs:
        """Standard-normal q, k, v; a such that softplus(a + dt_bias) is uniform in [0.1, 1] (so g lies in
        LOG_DECAY_RANGE with layer's A_log), b such that σ(b) is uniform in BETA_RANGE."""
        num_v_heads = layer.A_log.shape[0]
        device = layer.A_log.device

        def normal(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, device=device).to(dtype)

        def uniform(low: float, high: float) -> torch.Tensor:
            return low + (high - low) * torch.rand(batch, num_v_heads, generator=gen, device=device)

        softplus = uniform(0.1, 1.0)
        a = torch.log(torch.expm1(softplus)) - layer.dt_bias  # softplus's inverse
        b = torch.logit(uniform(*BETA_RANGE))
        q, k = normal(batch, num_k_heads, head_k_dim), normal(batch, num_k_heads, head_k_dim)
        return cls(q=q, k=k, v=normal(batch, num_v_heads, head_v_dim), a=a.to(gate_dtype), b=b.to(gate_dtype))

    def rows(self, index: slice | torch.Tensor) -> GdnStepInputs:
        return GdnStepInputs(self.q[index], self.k[index], self.v[index], self.a[index], self.b[index])
