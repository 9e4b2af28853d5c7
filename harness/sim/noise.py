"""Calibrated step-time noise for the embedded engine, so simulated repeats vary the way real ones do.

Without noise the engine is deterministic: a simulated A/A has a zero-width CI and a simulated A/B is decided
with certainty. With noise every step time is multiplied by `exp(shared + run + e_t)`:

- `shared`: one draw per (seed, repeat), the same for both arms of a repeat (a host-level factor: the arms of
  the H200 A/A moved together, correlation 0.84);
- `run`: one draw per (seed, repeat, arm);
- `e_t`: a stationary AR(1) over the run's steps (jitter that drifts).

It enters where GPU and host noise enter, so the scheduler and the queues propagate it as they would real
noise. The default sizes are the fit to the H200 A/A in `../shared/research/decision_validity.md` §3.
Every draw comes from seeds derived from (seed, repeat, arm): the same run gives the same result file.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

from harness.errors import UserError


@dataclass(frozen=True)
class NoiseModel:
    """Standard deviations of the log step-time multiplier's parts; all zero means no noise."""

    shared_sd: float = 0.025
    run_sd: float = 0.008
    step_sd: float = 0.07
    step_phi: float = 0.9

    def __post_init__(self) -> None:
        for name in ("shared_sd", "run_sd", "step_sd"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                flag = "--noise-" + name.removesuffix("_sd")
                raise UserError(f"{flag} {value:g} must be in [0, 1) (a log-scale sd: 0.025 = 2.5 %)")
        if not -1 < self.step_phi < 1:
            raise UserError(f"--noise-phi {self.step_phi:g} must be in (-1, 1) (the AR(1) coefficient; 0.9 fits H200)")

    @property
    def enabled(self) -> bool:
        return any((self.shared_sd, self.run_sd, self.step_sd))

    def describe(self) -> str:
        if not self.enabled:
            return "off (deterministic step times)"
        return (
            f"shared per repeat {self.shared_sd:.1%}, per run {self.run_sd:.1%}, "
            f"step AR(1) {self.step_sd:.1%} (phi {self.step_phi:g})"
        )


NO_NOISE = NoiseModel(0.0, 0.0, 0.0, 0.0)


class StepNoise:
    """The multipliers of one run's steps, for one (seed, repeat, arm); `step_scale` is a what-if on top (0.9: a
    10 % faster step), so a planned candidate and its noise go through the same queues."""

    def __init__(self, model: NoiseModel, seed: int, repeat: int, arm: str, step_scale: float = 1.0) -> None:
        if step_scale <= 0:
            raise UserError(f"--step-scale {step_scale:g} must be > 0 (0.9 = every step 10 % faster)")
        self.model, self.seed, self.repeat, self.arm, self.step_scale = model, seed, repeat, arm, step_scale
        # string seeds are hashed (SHA-512) by `random`: stable across processes, platforms and Python versions
        self.shared = random.Random(f"noise:{seed}:{repeat}:shared").gauss(0.0, model.shared_sd)
        self._rng = random.Random(f"noise:{seed}:{repeat}:run:{arm}")
        self.run = self._rng.gauss(0.0, model.run_sd)
        self._innovation_sd = model.step_sd * math.sqrt(1 - model.step_phi**2)
        self._e = self._rng.gauss(0.0, model.step_sd)  # start in the stationary distribution

    def factor(self) -> float:
        """The next step's multiplier."""
        self._e = self.model.step_phi * self._e + self._rng.gauss(0.0, self._innovation_sd)
        return self.step_scale * math.exp(self.shared + self.run + self._e)

    def label(self) -> str:
        return f"{self.model.describe()}; seed {self.seed}, repeat {self.repeat}, arm {self.arm}"

    def describe(self) -> dict[str, object]:
        """What a result file records: the model, the seeds, and this run's two level draws."""
        return asdict(self.model) | {
            "seed": self.seed,
            "repeat": self.repeat,
            "arm": self.arm,
            "shared": self.shared,
            "run": self.run,
            "step_scale": self.step_scale,
        }


def step_noise(model: NoiseModel, seed: int, repeat: int, arm: str, step_scale: float = 1.0) -> StepNoise | None:
    """The run's step multipliers, or None when there are none (the engine then keeps its own step times)."""
    return StepNoise(model, seed, repeat, arm, step_scale) if model.enabled or step_scale != 1.0 else None
