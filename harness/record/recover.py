"""`replaybench record --recover DIR`: turn segments left behind by a killed recorder into Parquet parts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import UserError
from harness.record.naming import SEGMENT_SUFFIX
from harness.record.parts import PartWritten, finish_segment_when_free


@dataclass
class RecoverReport:
    written: list[PartWritten] = field(default_factory=list)
    in_use: list[Path] = field(default_factory=list)  # held by a running recorder: left alone
    failed: list[str] = field(default_factory=list)  # one line per segment that could not be converted


def recover(directory: Path) -> RecoverReport:
    if not directory.is_dir():
        raise UserError(f"--recover {directory}: not a directory; give the directory the recording was written to")
    report = RecoverReport()
    for segment in sorted(directory.glob(f"*{SEGMENT_SUFFIX}")):
        try:
            written = finish_segment_when_free(segment)
        except (ValueError, UserError) as problem:
            report.failed.append(str(problem))
            continue
        if written is not None:
            report.written.append(written)
        elif segment.exists():
            report.in_use.append(segment)
    return report
