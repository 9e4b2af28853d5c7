"""One step's metadata of every KV-cache group, made as vLLM 0.24's model runner makes it, and its host time.

Shared by the builder benchmarks' timing scripts (run inside vLLM's CPU venv): the first group's ``build()``, then
``update_block_table`` for every other group whose builder offers it, else a ``build()`` each
(``GPUModelRunner._build_attn_group_metadata``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Step:
    """One step's common metadata, what kind of step it is, and the extra build arguments vLLM passes."""

    kind: str
    metadata: Any
    build_args: dict[str, Any] = field(default_factory=dict)


def group_metadata(builders: Sequence[Any], step: Step) -> None:
    """Every group's metadata of one step."""
    m = step.metadata
    first = builders[0].build(0, m, **step.build_args)
    for builder in builders[1:]:
        if builder.supports_update_block_table:
            builder.update_block_table(first, m.block_table_tensor, m.slot_mapping)
        else:
            builder.build(0, m, **step.build_args)


def time_steps(builders: Sequence[Any], steps: Sequence[Step], rounds: int = 5, warmup: int = 30) -> dict[str, float]:
    """Median over ``rounds`` of the mean µs per step of each kind (the first steps also warm up: the cursor table
    is sized at the first real build)."""
    for step in steps[:warmup]:
        group_metadata(builders, step)
    means: dict[str, list[float]] = {kind: [] for kind in dict.fromkeys(s.kind for s in steps)}
    for _ in range(rounds):
        spent = dict.fromkeys(means, 0.0)
        for step in steps:
            began = time.perf_counter()
            group_metadata(builders, step)
            spent[step.kind] += time.perf_counter() - began
        for kind in means:
            means[kind].append(spent[kind] / sum(s.kind == kind for s in steps) * 1e6)
    return {kind: round(statistics.median(values), 1) for kind, values in means.items()}


def sharing(builders: Sequence[Any]) -> dict[str, int]:
    """How many builds and block-table updates a step makes."""
    shared = sum(b.supports_update_block_table for b in builders[1:])
    return {"builds per step": len(builders) - shared, "block-table updates per step": shared}
