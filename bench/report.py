"""Write a benchmark's results as JSON and a Markdown table, stamped with the command and machine."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

RESULTS_DIR = Path(__file__).parent / "results"


def write_results(
    name: str,
    title: str,
    rows: list[dict[str, object]],
    notes: str = "",
    *,
    command: str | None = None,
    out_dir: Path = RESULTS_DIR,
) -> None:
    """Save `rows` to <out_dir>/<name>.json and .md, stamped with the command that made them (default: the
    `make bench` run of this benchmark), and print the table."""
    out_dir.mkdir(parents=True, exist_ok=True)
    command = command or f"make bench  # or: python -m bench {name.removeprefix('bench_')}"
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}, load average {load}"
    payload = {"benchmark": name, "title": title, "command": command, "machine": machine, "rows": rows, "notes": notes}
    (out_dir / f"{name}.json").write_text(json.dumps(payload, indent=1) + "\n")
    columns = list(rows[0]) if rows else []
    lines = [f"# {title}", "", f"Command: `{command}`  ", f"Machine: {machine}", ""]
    if columns:
        lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]
    if notes:
        lines += ["", notes]
    text = "\n".join(lines) + "\n"
    (out_dir / f"{name}.md").write_text(text)
    print(text)
