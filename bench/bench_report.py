"""Analysis + report time and peak memory for 10 repeats x 2 arms x 100,000 requests (generated results).

The measured part runs in a fresh subprocess so its peak RSS is its own, not the generator's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.report import write_results

REPEATS, REQUESTS, MEAN_OUTPUT_TOKENS = 10, 100_000, 48

MEASURE = """
import json, resource, sys, time
from pathlib import Path
from harness.analysis.analyse import analyse_run_dir
from harness.records.run_dir import RunDir
from harness.report.build import write_outputs
t1, c1 = time.perf_counter(), time.process_time()
analysis = analyse_run_dir(Path(sys.argv[1]))
t2, c2 = time.perf_counter(), time.process_time()
write_outputs(RunDir(Path(sys.argv[1])), analysis)
t3, c3 = time.perf_counter(), time.process_time()
print(json.dumps({"analyse_s": t2 - t1, "report_s": t3 - t2, "analyse_cpu_s": c2 - c1, "report_cpu_s": c3 - c2,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "outcome": analysis.summary.decision.outcome.value}))
"""


def main() -> None:
    from tests.support.synthetic_results import Scenario, write_run_dir

    with tempfile.TemporaryDirectory(prefix="bench_report_") as tmp:
        started = time.perf_counter()
        run = write_run_dir(
            Path(tmp) / "run",
            Scenario(
                repeats=REPEATS, requests=REQUESTS, rate=100.0, itl_factor=0.9, mean_output_tokens=MEAN_OUTPUT_TOKENS
            ),
        )
        generated_s = time.perf_counter() - started
        size_mib = sum(p.stat().st_size for p in run.results_dir.glob("*.parquet")) / 2**20
        started = time.perf_counter()
        child = subprocess.run(
            [sys.executable, "-c", MEASURE, str(run.root)],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parents[1],
        )
        total_s = time.perf_counter() - started
        measured = json.loads(child.stdout.strip().splitlines()[-1])
    rows = [
        {
            "runs": f"{REPEATS} repeats x 2 arms x {REQUESTS:,} requests",
            "result files (MiB)": round(size_mib, 1),
            "analyse wall (s)": round(measured["analyse_s"], 1),
            "analyse CPU (s)": round(measured["analyse_cpu_s"], 1),
            "render report wall (s)": round(measured["report_s"], 1),
            "render report CPU (s)": round(measured["report_cpu_s"], 1),
            "process wall incl. imports (s)": round(total_s, 1),
            "peak RSS (MiB)": round(measured["peak_rss_mib"]),
            "target": "< 30 s",
        }
    ]
    notes = (
        f"Generated lognormal results (mean {MEAN_OUTPUT_TOKENS} output tokens per request, so ~"
        f"{REQUESTS * MEAN_OUTPUT_TOKENS / 1e6:.1f} M inter-token gaps per run) written in {generated_s:.0f} s "
        f"(not counted). Analysis = reading every Parquet file, per-run metrics, paired statistics (request-paired "
        f"p50s), planning, stability detectors and the review tables; report = five figures + HTML, "
        f"JSON, Markdown, JUnit. Measured on a {os.cpu_count()}-core machine (load average in the header); CPU seconds "
        f"(user + system of the analysing process) are what an idle machine would need. Decision on this data: "
        f"{measured['outcome']}."
    )
    write_results("bench_report", "Analysis + report: 10 repeats x 2 arms x 100,000 requests", rows, notes)
