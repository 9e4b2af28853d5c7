"""Which GPUs serve which arm in each repeat, and whether servers stay up between repeats.

With fixed GPUs, arm and GPU slot are confounded: the H200 A/A showed a slot effect (the same arm's slot
drained longer in 5 of 5 repeats). `placement = "swap"` (the default) exchanges the two arms' `gpus` in odd
repeats: baseline on its own GPUs in even repeats, on the candidate's in odd ones, so an even number of
repeats balances the slots. Only launched servers can be moved; servers attached by `url` stay where they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.experiment.config import ExperimentConfig


@dataclass(frozen=True)
class Placement:
    """The GPUs of each arm in one repeat."""

    repeat: int
    gpus: dict[str, tuple[int, ...]]
    swapped: bool

    def as_dict(self) -> dict[str, object]:
        return {"repeat": self.repeat, "swapped": self.swapped} | {arm: list(ids) for arm, ids in self.gpus.items()}


def _movable(config: ExperimentConfig) -> bool:
    base, cand = config.arm("baseline"), config.arm("candidate")
    return config.placement == "swap" and base.gpus != cand.gpus and base.launched and cand.launched


def placement(config: ExperimentConfig, repeat: int) -> Placement:
    """Baseline on its own GPUs in even repeats and on the candidate's in odd ones (under `swap`)."""
    base, cand = tuple(config.arm("baseline").gpus), tuple(config.arm("candidate").gpus)
    swapped = _movable(config) and repeat % 2 == 1
    return Placement(repeat, {"baseline": cand if swapped else base, "candidate": base if swapped else cand}, swapped)


def placement_policy(config: ExperimentConfig) -> dict[str, object]:
    """What env.json says about placement and restarts before the first repeat."""
    base, cand = config.arm("baseline"), config.arm("candidate")
    if _movable(config):
        note = f"arms exchange GPUs every repeat: baseline on {base.gpus} in even repeats, on {cand.gpus} in odd ones"
    elif base.gpus == cand.gpus:
        note = f"both arms on the same GPUs {base.gpus}: nothing to swap"
    elif config.placement == "fixed":
        note = "placement = fixed: each arm keeps its GPUs, so arm and GPU are confounded"
    else:
        note = "servers attached by url cannot be moved: each arm keeps its GPUs, so arm and GPU are confounded"
    if config.restart_per_repeat:
        restart = "a fresh server for every arm and repeat (restart_per_repeat = true)"
    else:
        restart = (
            "servers stay up across repeats, both resident at once (restart_per_repeat = false); a server is "
            "restarted only after a crash or when the swap moves it to other GPUs"
        )
    return {
        "policy": config.placement,
        "swaps": _movable(config),
        "note": note,
        "restart_per_repeat": config.restart_per_repeat,
        "restart": restart,
        "repeats": [],
    }
