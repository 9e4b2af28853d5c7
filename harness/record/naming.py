"""File names of a recording: numbered Parquet parts and the segment file each part grows from.

`-o traces/prod.parquet` writes `traces/prod-0001.parquet`, `traces/prod-0002.parquet`, ... (one per
rotation); `-o traces/` (an existing directory, or a path ending in '/') writes `traces/record-0001.parquet`, ...
While part N is being recorded its rows live in `<stem>-NNNN.segment.jsonl` next to it; the segment is
deleted once the part is safely written. Numbering continues after the highest part or segment already
there, so an earlier recording is never overwritten.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

SEGMENT_SUFFIX = ".segment.jsonl"
PART_SUFFIX = ".parquet"
DIRECTORY_STEM = "record"


@dataclass(frozen=True)
class PartNaming:
    directory: Path
    stem: str

    @classmethod
    def from_output(cls, output: Path) -> PartNaming:
        if output.is_dir() or str(output).endswith(("/", os.sep)):
            return cls(output, DIRECTORY_STEM)
        name = output.name.removesuffix(PART_SUFFIX)
        return cls(output.parent, name or DIRECTORY_STEM)

    def for_worker(self, worker: int) -> PartNaming:
        """Worker `worker` of `--workers N` writes `<stem>-w<worker>-NNNN.parquet`: no two workers share a file."""
        return PartNaming(self.directory, f"{self.stem}-w{worker}")

    def part(self, index: int) -> Path:
        return self.directory / f"{self.stem}-{index:04d}{PART_SUFFIX}"

    def segment(self, index: int) -> Path:
        return self.directory / f"{self.stem}-{index:04d}{SEGMENT_SUFFIX}"

    @property
    def pattern(self) -> str:
        return str(self.directory / f"{self.stem}-NNNN{PART_SUFFIX}")

    def next_index(self) -> int:
        """One past the highest index used by a part or segment of this stem (1 for a fresh directory)."""
        taken = re.compile(rf"^{re.escape(self.stem)}-(\d+)({re.escape(PART_SUFFIX)}|{re.escape(SEGMENT_SUFFIX)})$")
        try:
            names = os.listdir(self.directory)
        except OSError:
            return 1
        return max((int(m.group(1)) for m in map(taken.match, names) if m), default=0) + 1


def part_for_segment(segment: Path) -> Path:
    """`prod-0003.segment.jsonl` -> `prod-0003.parquet`, in the same directory."""
    return segment.with_name(segment.name.removesuffix(SEGMENT_SUFFIX) + PART_SUFFIX)
