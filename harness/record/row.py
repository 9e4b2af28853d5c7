"""One recorded request: exactly the trace columns, as one JSON line of a segment file."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

from harness.records.trace_schema import TRACE_SCHEMA


@dataclass
class RecordedRow:
    """A finished request as the trace will hold it (DESIGN §2); text fields already redacted."""

    request_id: str
    arrival_s: float
    api: str
    prompt_tokens: int
    output_tokens: int
    params: str
    session_id: str | None = None
    model: str | None = None
    prompt: str | None = None
    messages: str | None = None
    prefix_block_ids: list[int] | None = None
    tenant: str | None = None
    status: int | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    finish_reason: str | None = None

    def to_line(self) -> bytes:
        """The segment line: compact JSON plus a newline (a line without its newline is torn)."""
        values = {name: getattr(self, name) for name in ROW_FIELDS}  # not asdict(): that deep-copies, slowly
        return json.dumps(values, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"

    @classmethod
    def from_line(cls, line: bytes) -> RecordedRow:
        """Parse one segment line; raises ValueError for a torn or foreign line."""
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError("not a row object")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(str(exc)) from None


ROW_FIELDS = tuple(f.name for f in fields(RecordedRow))
assert set(ROW_FIELDS) == set(TRACE_SCHEMA.names), "RecordedRow must mirror TRACE_SCHEMA"
