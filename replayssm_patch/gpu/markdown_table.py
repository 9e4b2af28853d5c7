"""The markdown tables the GPU summaries print: one way to write a row and a header, so every table reads alike."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def table_row(cells: Iterable[object]) -> str:
    """One row: each cell as text between bars."""
    return "| " + " | ".join(map(str, cells)) + " |"


def table_head(head: Sequence[object]) -> list[str]:
    """The header row and the rule under it."""
    return [table_row(head), "|" + "---|" * len(head)]
