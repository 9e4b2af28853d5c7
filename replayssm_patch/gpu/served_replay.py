"""A model served with the plugin, checked end to end from one replay: every request answered, every answer exactly
the trace's output length, the plugin active in the server's log (issue 16's qwen3.5-35b-a3b check).

GPU host, after `replaybench replay SLICE.parquet --url URL -o RESULT.parquet` against the running server
(tools/gpu/onegpu.sh `moe`):

    python3 -m replayssm_patch.gpu.served_replay RESULT.parquet --model-dir /tmp/model-qwen35moe \
        --variant replayssm_fp32 --mode default --server-log /tmp/gpu/candidate-moe.log --out served.json

Writes one JSON object (counts, latency percentiles from the analysis, the server's start-up facts, `passed` and
its problems) and prints one line; exits 1 when the check fails.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from harness.analysis.run_metrics import TimeBlocks, load_run
from harness.atomic import atomic_path
from harness.records.decision_config import CostConfig, DecisionConfig, SloConfig
from harness.records.result_io import read_results
from replayssm_patch.gpu.engine_step import command_line
from replayssm_patch.gpu.serve_check import log_facts
from replayssm_patch.gpu.variants import MODES, VARIANTS

PLUGIN_LINE = "ReplaySSM active"  # logged by the plugin itself when it replaced the model's layers
LATENCIES = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "e2e_p50", "e2e_p99")


def server_facts(log: Path | None) -> dict[str, Any]:
    """vLLM's start-up capacity figures (serve_check.log_facts) and the plugin's own line, from the server's log."""
    if log is None or not log.exists():
        return {"log": None, "replayssm": None}
    plugin = [line.strip() for line in log.read_text(errors="replace").splitlines() if PLUGIN_LINE in line]
    return {"log": str(log), "replayssm": plugin[0][-200:] if plugin else None, **log_facts(log)}


def replay_counts(result: Path) -> dict[str, Any]:
    """Requests, failures by class, exact output lengths and latency percentiles of one replay's result file."""
    table, _ = read_results(result)
    run = load_run(result, TimeBlocks(0.0, 1.0, 1), SloConfig(), DecisionConfig(), CostConfig())
    ok = run.requests["ok"].to_numpy()
    usage = table.column("output_tokens_usage").to_numpy(zero_copy_only=False)
    asked = table.column("expected_output_tokens").to_numpy(zero_copy_only=False)
    return {
        "requests": len(ok),
        "succeeded": int(ok.sum()),
        "failures": run.failures,
        "exact_lengths": int(np.sum(ok & (usage == asked))),
        "output_tokens": int(np.nansum(np.where(ok, usage, 0).astype(float))),
        "duration_s": round(run.duration_s, 2),
        "replay_valid": run.fidelity.valid,
        "replay_invalid_reasons": list(run.fidelity.reasons),
        **{f"{name}_ms": _ms(run.metrics.get(name)) for name in LATENCIES},
    }


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1e3, 2) if seconds is not None and math.isfinite(seconds) else None


def problems_of(counts: dict[str, Any], facts: dict[str, Any], variant: str) -> list[str]:
    """What fails the check, one line each (empty: passed)."""
    problems = []
    if not counts["requests"]:
        problems.append("the result file holds no request")
    if counts["failures"]:
        problems.append(f"{sum(counts['failures'].values())} request(s) failed: {counts['failures']}")
    if counts["exact_lengths"] < counts["succeeded"]:
        inexact = counts["succeeded"] - counts["exact_lengths"]
        problems.append(f"{inexact} answer(s) not of the trace's exact output length")
    if VARIANTS[variant] is not None and facts["replayssm"] is None:
        problems.append(f"no '{PLUGIN_LINE}' line in the server log: the plugin did not replace the layers")
    return problems


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m replayssm_patch.gpu.served_replay", description=__doc__.split("\n")[0])
    p.add_argument("result", type=Path, help="result file (.parquet) of `replaybench replay` against the server")
    p.add_argument("--model-dir", type=Path, required=True, help="the served model's dir (its config.json)")
    p.add_argument("--variant", choices=list(VARIANTS), required=True, help="what the server runs")
    p.add_argument("--mode", choices=list(MODES), default="default", help="the server's compile mode")
    p.add_argument("--server-log", type=Path, help="the server's log (start-up facts, the plugin's line)")
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    for path, what in ((args.result, "result file"), (args.model_dir / "config.json", "model config")):
        if not path.exists():
            print(f"error: {path}: no such {what}; give the replay's result file and the served model's dir")
            return 2
    config = json.loads((args.model_dir / "config.json").read_text())
    counts, facts = replay_counts(args.result), server_facts(args.server_log)
    problems = problems_of(counts, facts, args.variant)
    document = {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "command": command_line("replayssm_patch.gpu.served_replay", argv),
        "date": dt.date.today().isoformat(),
        "model": {"dir": str(args.model_dir), "architectures": config.get("architectures", [])},
        "variant": args.variant,
        "mode": args.mode,
        "result": str(args.result),
        **counts,
        "server": facts,
        "passed": not problems,
        "problems": problems,
    }
    with atomic_path(args.out) as tmp:
        tmp.write_text(json.dumps(document, indent=2) + "\n")
    print(
        f"served {args.variant} {args.mode} {'/'.join(document['model']['architectures'])}: "
        f"{'PASS' if not problems else 'FAIL'}, {counts['succeeded']}/{counts['requests']} answered, "
        f"{counts['exact_lengths']} exact, TPOT p50 {counts['tpot_p50_ms']} ms, TTFT p99 {counts['ttft_p99_ms']} ms"
        + "".join(f"; {p}" for p in problems)
    )
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
