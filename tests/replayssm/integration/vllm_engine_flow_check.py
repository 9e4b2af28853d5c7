"""engine_step.py's and step_profile.py's whole flow, run in the vLLM CPU venv against a stand-in for `vllm.LLM`.

No engine starts without a GPU, so `vllm.LLM` is replaced by an object with the same methods that answers as
vLLM 0.24 does (real SamplingParams and TokensPrompt come in, real RequestStateStats and metric Counters go
out, a torch.profiler-shaped trace is written on stop_profile). It records every call, so the test can check
the order of the generates, their parameters, the prompts and what lands in the results files.
Args: a model dir, the result file (the run's files go beside it). Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import gzip
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import torch
import vllm
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind
from vllm.v1.metrics.reader import Counter
from vllm.v1.metrics.stats import RequestStateStats

from replayssm_patch.gpu import churn_host_profile, churn_step, engine_step, step_profile
from tests.replayssm.integration.trace_fixture import decode_trace

VOCAB = 5000


class ReplayMambaMixer2(torch.nn.Module):
    """Named as the plugin's layer, so count_replay_layers finds it in the stand-in model."""


PREFILL_ROWS_PER_STEP = 2  # 2048 batched tokens of 1024-token prompts
CONCURRENCY = 70.5  # vLLM's maximum concurrency the stand-in engine reports: `--batches fit` runs 64 requests
PREFILL_STEP_S, DECODE_STEP_S = 0.040, 0.005  # the stand-in engine core's clock: what the decode window must read
CANDIDATE_MIXED_WORK_S = 0.002  # host work the stand-in does only with the plugin on, only in steps that admit


def candidate_mixed_step_work() -> None:
    """What churn_host_profile must find as the candidate's extra host time: its mixed steps only."""
    time.sleep(CANDIDATE_MIXED_WORK_S)


class StandInEngine:
    """The `LLMEngine` methods stepped_generate uses, answering as vLLM 0.24's does with stats on and DELTA
    outputs: real RequestOutput / CompletionOutput / RequestStateStats, every output of a step stamped with the
    engine core's time of that step. Prefill admits `admit_per_step` requests per step (their first token comes
    out of it, beside the running requests' next tokens); each running request then gets `tokens_per_step` tokens
    per step (more than 1: a speculative step), and `on_step(decoding rows, tokens)` hears of every step."""

    def __init__(self, llm: StandInLLM):
        self.llm, self.waiting, self.running = llm, [], []
        self.model_config = SimpleNamespace(get_vocab_size=lambda: VOCAB)
        self.vllm_config = SimpleNamespace(
            scheduler_config=SimpleNamespace(max_num_batched_tokens=2048),
            cache_config=SimpleNamespace(kv_cache_max_concurrency=CONCURRENCY),
        )
        self.clock = 1000.0
        self.admit_per_step, self.tokens_per_step, self.wall_s_per_step = PREFILL_ROWS_PER_STEP, 1, 0.0
        self.on_step = None

    def add_request(self, request_id, prompt, params):
        assert params.output_kind == RequestOutputKind.DELTA
        if not self.waiting and not self.running:
            self.call = self.llm.record(prompt, params, stepped=True)
        ids = prompt["prompt_token_ids"]
        self.call["batch"] += 1
        self.call["ids_in_range"] &= min(ids) >= 10 and max(ids) < VOCAB
        self.llm.last_batch = self.call["batch"]
        self.waiting.append({"id": request_id, "params": params, "made": 0, "stats": RequestStateStats()})
        return request_id

    def abort_request(self, request_ids):
        self.waiting = [r for r in self.waiting if r["id"] not in request_ids]
        self.running = [r for r in self.running if r["id"] not in request_ids]

    def has_unfinished_requests(self):
        return bool(self.waiting or self.running)

    def step(self):
        admitted = self.waiting[: self.admit_per_step]
        del self.waiting[: self.admit_per_step]
        self.clock += PREFILL_STEP_S if admitted else DECODE_STEP_S
        if admitted and self.running and "additional_config" in self.llm.kwargs:
            candidate_mixed_step_work()
        outputs = []
        for request in self.running + admitted:
            new = (
                1 if request in admitted else min(self.tokens_per_step, request["params"].max_tokens - request["made"])
            )
            request["made"] += new
            stats = request["stats"]
            stats.num_generation_tokens = request["made"]
            stats.first_token_ts = stats.first_token_ts or self.clock
            stats.last_token_ts = self.clock
            done = request["made"] == request["params"].max_tokens
            completion = CompletionOutput(0, "", list(range(new)), None, None, "length" if done else None)
            outputs.append(RequestOutput(request["id"], None, [], None, [completion], done, metrics=stats))
        if self.on_step is not None:
            self.on_step(len(self.running), sum(len(o.outputs[0].token_ids) for o in outputs))
        self.running = [r for r in self.running + admitted if r["made"] < r["params"].max_tokens]
        time.sleep(self.wall_s_per_step)
        return outputs


class StandInLLM:
    """The `vllm.LLM` methods the scripts use; `generate` answers like vLLM with engine stats on."""

    made: ClassVar[list[StandInLLM]] = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls = kwargs, []
        self.llm_engine = StandInEngine(self)
        self.profiling, self.last_batch = False, 0
        StandInLLM.made.append(self)

    def record(self, prompt, params, stepped: bool, batch: int = 0, ids_in_range: bool = True, use_tqdm=False):
        """One generate's call as the test checks it (a stepped one is recorded at its first request and counted
        up by the engine as the others come)."""
        self.calls.append({"batch": batch, "prompt_len": len(prompt["prompt_token_ids"]),
                           "ids_in_range": ids_in_range, "max_tokens": params.max_tokens,
                           "min_tokens": params.min_tokens, "ignore_eos": params.ignore_eos,
                           "temperature": params.temperature, "detokenize": params.detokenize,
                           "use_tqdm": use_tqdm, "profiling": self.profiling, "stepped": stepped})  # fmt: skip
        return self.calls[-1]

    def apply_model(self, fn):
        enabled = "additional_config" in self.kwargs
        layers = [ReplayMambaMixer2() if enabled else torch.nn.Identity() for _ in range(24)]
        return [fn(torch.nn.Sequential(*layers))]

    def get_metrics(self):
        return [Counter(name="vllm:num_preemptions", labels={}, value=0)]

    def generate(self, prompts, params, use_tqdm=True):
        ids = [i for p in prompts for i in p["prompt_token_ids"]]
        self.record(prompts[0], params, False, len(prompts), min(ids) >= 10 and max(ids) < VOCAB, use_tqdm)
        self.last_batch = len(prompts)
        now, n = time.monotonic(), params.max_tokens
        return [
            SimpleNamespace(
                outputs=[SimpleNamespace(token_ids=list(range(n)))],
                metrics=RequestStateStats(
                    num_generation_tokens=n, first_token_ts=now + 0.001 * i, last_token_ts=now + 1 + 0.01 * n
                ),
            )
            for i in range(len(prompts))
        ]

    def start_profile(self, profile_prefix=None):
        self.profiling = True
        # churn_step starts the profiler with its requests in flight: the trace's batch is theirs
        engine = self.llm_engine
        self.profile_batch = len(engine.running) + len(engine.waiting) or None

    def stop_profile(self):
        self.profiling = False
        out = Path(self.kwargs["profiler_config"]["torch_profiler_dir"])
        trace = out / f"rank0.{time.time_ns()}.pt.trace.json.gz"
        with gzip.open(trace, "wt") as handle:
            batch = self.profile_batch or self.last_batch
            json.dump({"traceEvents": decode_trace(batch=batch, decode_steps=20, mixed_steps=5)}, handle)


def run(main, argv: list[str]) -> dict:
    StandInLLM.made.clear()
    code = main(argv)
    llm = StandInLLM.made[0] if StandInLLM.made else None
    kwargs = {k: str(v) for k, v in llm.kwargs.items()} if llm else {}
    return {"exit": code, "calls": llm.calls if llm else [], "kwargs": kwargs}


def main(model: Path, result_file: Path) -> None:
    vllm.LLM = StandInLLM
    out = result_file.parent
    steps = out / "engine_step.json"
    model_args = ["--model", str(model)]
    split = [*model_args, "--variant", "replayssm_split", "--mode", "default", "--batches", "4,8", "--out", str(steps)]
    baseline = [*model_args, "--batches", "4", "--repeats", "1", "--out", str(steps)]
    profile = [*model_args, "--variant", "replayssm_fp32", "--batches", "4", "--out", str(out / "profile")]
    fit = [*model_args, "--batches", "fit", "--repeats", "1", "--out", str(out / "fit_steps.json")]
    both = [*model_args, "--variant", "replayssm_fp32", "--batches", "4", "--out", str(out / "both"),
            "--step-batches", "4,8", "--steps-out", str(out / "both_steps.json"), "--repeats", "1"]  # fmt: skip
    churn = [*model_args, "--variant", "replayssm_fp32", "--batches", "4", "--output-tokens", "8", "--steps", "40",
             "--repeats", "2", "--out", str(out / "churn.json"),
             "--profile-out", str(out / "churn_profile")]  # fmt: skip
    host_churn = [*model_args, "--batches", "4", "--output-tokens", "8", "--steps", "40",
                  "--out", str(out / "host_churn.json")]  # fmt: skip
    result = {
        "host_churn_baseline": run(churn_host_profile.main, host_churn),
        "host_churn_candidate": run(churn_host_profile.main, [*host_churn, "--variant", "replayssm_fp32"]),
        "host_churn_file": json.loads((out / "host_churn.json").read_text()),
        "host_churn_md": (out / "host_churn.md").read_text(),
        "churn": run(churn_step.main, churn),
        "churn_file": json.loads((out / "churn.json").read_text()),
        "churn_profile_file": json.loads((out / "churn_profile" / "step_profile.json").read_text()),
        "churn_profile_md": (out / "churn_profile" / "step_profile.md").read_text(),
        "churn_traces_left": sorted(p.name for p in (out / "churn_profile" / "traces").iterdir()),
        "churn_telemetry": sorted(p.name for p in (out / "churn-telemetry").iterdir()),
        "split": run(engine_step.main, split),
        "baseline": run(engine_step.main, baseline),
        "profile": run(step_profile.main, profile),
        "fit": run(engine_step.main, fit),
        "fit_steps_file": json.loads((out / "fit_steps.json").read_text()),
        "both": run(step_profile.main, both),
        "both_steps_file": json.loads((out / "both_steps.json").read_text()),
        "both_profile_file": json.loads((out / "both" / "step_profile.json").read_text()),
        "steps_file": json.loads(steps.read_text()),
        "profile_file": json.loads((out / "profile" / "step_profile.json").read_text()),
        "profile_md": (out / "profile" / "step_profile.md").read_text(),
        "traces_left": sorted(p.name for p in (out / "profile" / "traces").iterdir()),
        "engine_telemetry": sorted(p.name for p in (out / "engine_step-telemetry").iterdir()),
    }
    result_file.write_text(json.dumps(result))


if __name__ == "__main__":
    main(*map(Path, sys.argv[1:3]))
