"""Random Mamba-2 layer parameters and decode-step inputs with realistic decay, for tests and benchmarks.

Realistic here means A = -exp(U[0, log 16]) per head and a step size dt = softplus(U[-5, 0]), i.e. per-step
decays exp(A*dt) from ~0.99 down to ~e^-11: dummy-weight models have A ~ 0, which would hide decay errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LayerParams:
    """Per-head A (negative), D and dt_bias of one Mamba-2 layer (fp32)."""

    A: torch.Tensor
    D: torch.Tensor
    dt_bias: torch.Tensor

    @classmethod
    def random(cls, nheads: int, gen: torch.Generator, device: torch.device | str = "cpu") -> LayerParams:
        def uniform() -> torch.Tensor:
            return torch.rand(nheads, generator=gen, device=device)

        return cls(
            A=-torch.exp(uniform() * math.log(16.0)),
            D=torch.randn(nheads, generator=gen, device=device),
            dt_bias=uniform() - 0.5,
        )


@dataclass(frozen=True)
class StepInputs:
    """One decode step's inputs for a batch: post-conv x, raw dt (before bias and softplus), B and C."""

    x: torch.Tensor  # [batch, nheads, head_dim]
    dt: torch.Tensor  # [batch, nheads] fp32
    B: torch.Tensor  # [batch, ngroups, d_state]
    C: torch.Tensor  # [batch, ngroups, d_state]

    @classmethod
    def random(
        cls,
        batch: int,
        nheads: int,
        head_dim: int,
        ngroups: int,
        d_state: int,
        layer: LayerParams,
        gen: torch.Generator,
        dtype: torch.dtype,
    ) -> StepInputs:
        """Standard-normal x, B, C in the model dtype; raw dt so that softplus(dt + dt_bias) = softplus(U[-5, 0])."""
        device = layer.A.device

        def normal(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, device=device).to(dtype)

        raw = torch.rand(batch, nheads, generator=gen, device=device) * 5.0 - 5.0
        return cls(
            x=normal(batch, nheads, head_dim),
            dt=raw - layer.dt_bias,
            B=normal(batch, ngroups, d_state),
            C=normal(batch, ngroups, d_state),
        )

    def rows(self, index: slice | torch.Tensor) -> StepInputs:
        return StepInputs(self.x[index], self.dt[index], self.B[index], self.C[index])
