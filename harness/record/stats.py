"""Counters of a recording session: the live status line and the shutdown summary read them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


@dataclass
class RecorderStats:
    requests: int = 0  # every request proxied, any route
    in_flight: int = 0
    bytes_to_clients: int = 0
    recorded: int = 0  # rows appended to a segment
    rows_lost: int = 0  # rows that could not be written (disk full, unwritable path)
    unfinished: int = 0  # still running when shutdown's drain time ran out
    too_large: int = 0  # request body over --max-body: forwarded, not recorded
    not_json: int = 0  # generation request whose body is not a JSON object: forwarded, not recorded
    upstream_failures: int = 0  # upstream unreachable or broken mid-response
    client_disconnects: int = 0
    worker_deaths: int = 0  # `--workers` processes that died: their last segment needs `--recover`
    bad_lines: int = 0  # torn/unreadable segment lines skipped while writing parts
    parts: list[Path] = field(default_factory=list)
    rows_in_parts: int = 0
    segments_kept: list[Path] = field(default_factory=list)  # could not become parts: use --recover

    @classmethod
    def added_up(cls, many: list[RecorderStats]) -> RecorderStats:
        """The counters of several workers as one recording's: numbers summed, lists joined."""
        total = cls()
        for one in many:
            for name in (f.name for f in fields(cls)):
                setattr(total, name, getattr(total, name) + getattr(one, name))
        return total

    @property
    def not_recorded(self) -> int:
        return self.rows_lost + self.unfinished + self.too_large + self.not_json + self.bad_lines

    def status_line(self, segment: Path | None) -> str:
        target = segment.name if segment else "nowhere (output not writable)"
        return (
            f"recording to {target}: {self.recorded} recorded, {self.in_flight} in flight, "
            f"{self.requests} proxied, {human_bytes(self.bytes_to_clients)} to clients, "
            f"{self.not_recorded} not recorded"
        )

    def summary_lines(self) -> list[str]:
        lines = [
            f"proxied {self.requests} requests ({human_bytes(self.bytes_to_clients)} to clients); "
            f"recorded {self.recorded}; {self.rows_in_parts} rows in {len(self.parts)} part(s)"
        ]
        lines += [f"  {part}" for part in self.parts]
        losses = {
            "rows lost to write errors": self.rows_lost,
            "unfinished at shutdown": self.unfinished,
            "bodies over --max-body": self.too_large,
            "bodies not JSON": self.not_json,
            "torn segment lines": self.bad_lines,
            "upstream failures": self.upstream_failures,
            "client disconnects": self.client_disconnects,
            "workers that died (run --recover)": self.worker_deaths,
        }
        shown = [f"{label}: {count}" for label, count in losses.items() if count]
        lines.append("not recorded / incidents: " + ("; ".join(shown) if shown else "none"))
        lines += [
            f"kept segment {segment}; convert it with `replaybench record --recover {segment.parent}`"
            for segment in self.segments_kept
        ]
        return lines
