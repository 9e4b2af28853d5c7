"""Import speed and peak memory: a generated 1,000,000-row Azure-format CSV through `replaybench import`.

Each measurement runs in a fresh subprocess (so peak RSS is the import's own, not this process's) and
times the whole command as a user runs it: start-up, CSV parse, validation and the Parquet write.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.report import write_results

ROWS = (19_366, 1_000_000)
REPEATS = 3
TARGET_S = {1_000_000: 10.0, 19_366: 2.0}
START = dt.datetime(2023, 11, 16, 18, 15, 46)

# Runs the import in-process, then reports wall time and the process's peak resident memory. VmHWM is
# per address space, so unlike ru_maxrss it does not inherit the parent's peak across fork + exec.
_MEASURE = """
import json, resource, sys, time
t0 = time.perf_counter()
from harness.trace.importers import import_trace
result = import_trace("azure", sys.argv[1])
result.trace.write(sys.argv[2])
elapsed = time.perf_counter() - t0
status = open("/proc/self/status").read() if sys.platform == "linux" else ""
hwm = [int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")]
peak_kib = hwm[0] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": elapsed, "rows": len(result.trace), "peak_rss_mib": peak_kib / 1024}))
"""


def write_azure_csv(path: Path, rows: int, seed: int = 0) -> None:
    """Poisson arrivals at ~280 req/s with 7-digit fractional timestamps, like the real file."""
    rng = np.random.default_rng(seed)
    ticks = np.cumsum(rng.exponential(1 / 280, rows) * 1e7).astype(np.int64)  # 100 ns units
    seconds, frac = np.divmod(ticks, 10_000_000)
    base = np.datetime64(START, "s") + seconds.astype("timedelta64[s]")
    stamps = np.char.add(np.char.add(np.datetime_as_string(base).astype(str), "."), np.char.zfill(frac.astype(str), 7))
    stamps = np.char.replace(stamps, "T", " ")
    prompts = rng.integers(1, 8000, rows).astype(str)
    outputs = rng.integers(1, 1000, rows).astype(str)
    body = np.char.add(np.char.add(np.char.add(np.char.add(stamps, ","), prompts), ","), outputs)
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(body.tolist()) + "\n")


def measure(src: Path, out: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(src), str(out)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def main() -> None:
    rows_out = []
    with tempfile.TemporaryDirectory() as tmp:
        for rows in ROWS:
            src = Path(tmp) / f"azure_{rows}.csv"
            started = time.perf_counter()
            write_azure_csv(src, rows)
            generated_s = time.perf_counter() - started
            runs = [measure(src, Path(tmp) / "out.parquet") for _ in range(REPEATS)]
            assert all(r["rows"] == rows for r in runs)
            seconds = sorted(r["seconds"] for r in runs)
            rows_out.append(
                {
                    "rows": f"{rows:,}",
                    "csv MiB": round(src.stat().st_size / 2**20, 1),
                    "import s (median of 3)": round(seconds[len(seconds) // 2], 2),
                    "import s (best)": round(seconds[0], 2),
                    "rows/s": f"{rows / seconds[len(seconds) // 2]:,.0f}",
                    "peak RSS MiB": round(max(r["peak_rss_mib"] for r in runs)),
                    "target s": TARGET_S[rows],
                    "generate CSV s": round(generated_s, 1),
                }
            )
    notes = (
        "Each import runs in a fresh Python process: imports, CSV parse (pyarrow), timestamp parse, "
        "validation and the zstd Parquet write, i.e. what `replaybench import azure` does minus CLI start-up. "
        "Peak RSS includes the interpreter and pyarrow/numpy (~100 MiB). The header gives the machine and its "
        "load average when the run ended."
    )
    write_results("bench_import", "Importing Azure-format CSV traces", rows_out, notes)


if __name__ == "__main__":
    main()
