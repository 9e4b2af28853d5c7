"""Generated run directories with known truth, for analysis/report tests and the report benchmark.

Latencies are lognormal per request; every repeat gets a load factor shared by both arms (the drift the
paired design cancels) and every (arm, repeat) run gets its own small noise factor. The candidate's true
effect is a multiplicative factor on TTFT and on the inter-token gaps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import tomli_w

from harness.records.result_io import write_results
from harness.records.result_schema import (
    META_ARM,
    META_COMPLETE,
    META_OFFERED_RATE,
    META_REPEAT,
    META_SIMULATED,
    META_TIME_SCALE,
    RESULT_SCHEMA,
)
from harness.records.run_dir import RunDir

ARMS = ("baseline", "candidate")


@dataclass
class Scenario:
    """What to generate; `ttft_factor` / `itl_factor` are the candidate's true effects (1.0 = none)."""

    repeats: int = 5
    requests: int = 2_000
    rate: float = 20.0  # requests/s of the trace
    ttft_factor: float = 1.0
    itl_factor: float = 1.0
    long_prompt_ttft_factor: float = 1.0  # the candidate's TTFT effect on the longest third of the prompts only
    tenants: tuple[str, ...] = ()  # request i is sent by tenants[i % len(tenants)]; () no tenant
    first_tenant_ttft_factor: float = 1.0  # the candidate's TTFT effect on the first tenant's requests only
    shared_noise: float = 0.05  # sigma of the per-repeat load factor (both arms)
    run_noise: float = 0.01  # sigma of each run's own factor
    drift: tuple[float, ...] = ()  # a factor per repeat on both arms, in run order (servers slowing); () none
    failure_rate: float = 0.002
    mean_output_tokens: float = 48.0
    lag_s: float = 0.0003  # typical client send lag
    seed: int = 0
    simulated: bool = True
    config: dict = field(default_factory=dict)  # experiment.toml tables (analysis + anything else)
    with_text: bool = False


def _run_table(
    scenario: Scenario,
    arm: str,
    repeat: int,
    arrivals: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    rng: np.random.Generator,
    factor: float,
) -> pa.Table:
    n = len(arrivals)
    ttft_factor = scenario.ttft_factor if arm == "candidate" else 1.0
    itl_factor = scenario.itl_factor if arm == "candidate" else 1.0
    if arm == "candidate":
        ttft_factor = ttft_factor * np.where(prompt > np.quantile(prompt, 2 / 3), scenario.long_prompt_ttft_factor, 1.0)
        first_tenant = np.arange(n) % max(1, len(scenario.tenants)) == 0
        ttft_factor = ttft_factor * np.where(first_tenant, scenario.first_tenant_ttft_factor, 1.0)
    ttft = 0.08 * (1 + prompt / 2000) * rng.lognormal(0, 0.4, n) * factor * ttft_factor
    gaps = 0.02 * rng.lognormal(0, 0.25, int(output.sum())) * factor * itl_factor
    starts = np.r_[0, np.cumsum(output)[:-1]]
    cumulative = np.cumsum(gaps)
    before = np.r_[0.0, cumulative][starts]  # cumulative gap total before each request's first token
    first_gap = gaps[starts]
    token_times = (cumulative - np.repeat(before + first_gap, output) + np.repeat(ttft, output)).astype(np.float32)
    e2e = token_times[starts + output - 1].astype(float)
    lag = rng.exponential(scenario.lag_s, n)
    failed = rng.random(n) < scenario.failure_rate
    offsets = np.r_[0, np.cumsum(output)].astype(np.int32)
    columns = {
        "request_id": pa.array([f"req-{i:06d}" for i in range(n)]),
        "arm": pa.array([arm] * n),
        "repeat": pa.array(np.full(n, repeat, np.int32)),
        "intended_s": pa.array(arrivals),
        "sent_s": pa.array(arrivals + lag),
        "lag_s": pa.array(lag),
        "status": pa.array(np.where(failed, 500, 200).astype(np.int16)),
        "error": pa.array(np.where(failed, "http_5xx", None).tolist(), pa.string()),
        "ttft_s": pa.array(np.where(failed, np.nan, ttft), mask=failed),
        "e2e_s": pa.array(np.where(failed, np.nan, e2e), mask=failed),
        "token_times": pa.ListArray.from_arrays(pa.array(offsets), pa.array(token_times)),
        "token_counts": pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.ones(len(token_times), np.int16))),
        "token_count_source": pa.array(["continuous_usage"] * n),
        "output_tokens": pa.array(output.astype(np.int32)),
        "output_tokens_usage": pa.array(output.astype(np.int32)),
        "expected_output_tokens": pa.array(output.astype(np.int32)),
        "prompt_tokens": pa.array(prompt.astype(np.int32)),
        "prompt_tokens_server": pa.array(prompt.astype(np.int32)),
        "tenant": pa.array(
            [scenario.tenants[i % len(scenario.tenants)] if scenario.tenants else None for i in range(n)], pa.string()
        ),
        "finish_reason": pa.array(["length"] * n),
        "worker": pa.array(np.zeros(n, np.int16)),
        "output_text": pa.array(
            [f"answer {i} from {arm}" for i in range(n)] if scenario.with_text else [None] * n, pa.string()
        ),
    }
    return pa.table(columns, schema=RESULT_SCHEMA)


def write_run_dir(root: Path, scenario: Scenario) -> RunDir:
    """Write results, experiment.toml, env.json and attempts.json of a complete synthetic paired run."""
    run = RunDir(Path(root))
    rng = np.random.default_rng(scenario.seed)
    n = scenario.requests
    arrivals = np.cumsum(rng.exponential(1 / scenario.rate, n))
    arrivals -= arrivals[0]
    prompt = np.maximum(1, rng.lognormal(np.log(600), 0.8, n)).astype(np.int64)
    output = np.maximum(1, rng.lognormal(np.log(scenario.mean_output_tokens), 0.6, n)).astype(np.int64)
    attempts = []
    for repeat in range(scenario.repeats):
        shared = rng.lognormal(0, scenario.shared_noise) * (scenario.drift[repeat] if scenario.drift else 1.0)
        for arm in ARMS:
            factor = shared * rng.lognormal(0, scenario.run_noise)
            table = _run_table(scenario, arm, repeat, arrivals, prompt, output, rng, factor)
            meta = {
                META_ARM: arm,
                META_REPEAT: str(repeat),
                META_COMPLETE: "true",
                META_TIME_SCALE: "1.0",
                META_OFFERED_RATE: str(n / (arrivals[-1] - arrivals[0])),
                META_SIMULATED: str(scenario.simulated).lower(),
            }
            write_results(run.result(arm, repeat), table, meta)
            attempts.append(
                {
                    "arm": arm,
                    "repeat": repeat,
                    "attempt": 0,
                    "status": "accepted",
                    "reason": "",
                    "path": str(run.result(arm, repeat).relative_to(run.root)),
                }
            )
    run.attempts_json.write_text(json.dumps(attempts, indent=1))
    run.experiment_toml.write_text(tomli_w.dumps({"name": "synthetic", **scenario.config}))
    run.env_json.write_text(json.dumps({"python": "3.11", "gpu": "synthetic", "git_sha": "0" * 40}))
    return run
