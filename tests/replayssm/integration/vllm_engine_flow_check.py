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
from vllm.v1.metrics.reader import Counter
from vllm.v1.metrics.stats import RequestStateStats

from replayssm_patch.gpu import engine_step, step_profile
from tests.replayssm.integration.trace_fixture import decode_trace

VOCAB = 5000


class ReplayMambaMixer2(torch.nn.Module):
    """Named as the plugin's layer, so count_replay_layers finds it in the stand-in model."""


class StandInLLM:
    """The `vllm.LLM` methods the scripts use; `generate` answers like vLLM with engine stats on."""

    made: ClassVar[list[StandInLLM]] = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls = kwargs, []
        config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_batched_tokens=2048))
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(get_vocab_size=lambda: VOCAB),
                                          vllm_config=config)  # fmt: skip
        self.profiling, self.last_batch = False, 0
        StandInLLM.made.append(self)

    def apply_model(self, fn):
        enabled = "additional_config" in self.kwargs
        layers = [ReplayMambaMixer2() if enabled else torch.nn.Identity() for _ in range(24)]
        return [fn(torch.nn.Sequential(*layers))]

    def get_metrics(self):
        return [Counter(name="vllm:num_preemptions", labels={}, value=0)]

    def generate(self, prompts, params, use_tqdm=True):
        ids = [i for p in prompts for i in p["prompt_token_ids"]]
        self.calls.append({"batch": len(prompts), "prompt_len": len(prompts[0]["prompt_token_ids"]),
                           "ids_in_range": min(ids) >= 10 and max(ids) < VOCAB, "max_tokens": params.max_tokens,
                           "min_tokens": params.min_tokens, "ignore_eos": params.ignore_eos,
                           "temperature": params.temperature, "detokenize": params.detokenize,
                           "use_tqdm": use_tqdm, "profiling": self.profiling})  # fmt: skip
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

    def stop_profile(self):
        self.profiling = False
        out = Path(self.kwargs["profiler_config"]["torch_profiler_dir"])
        trace = out / f"rank0.{time.time_ns()}.pt.trace.json.gz"
        with gzip.open(trace, "wt") as handle:
            json.dump({"traceEvents": decode_trace(batch=self.last_batch, decode_steps=20)}, handle)


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
    result = {
        "split": run(engine_step.main, split),
        "baseline": run(engine_step.main, baseline),
        "profile": run(step_profile.main, profile),
        "steps_file": json.loads(steps.read_text()),
        "profile_file": json.loads((out / "profile" / "step_profile.json").read_text()),
        "profile_md": (out / "profile" / "step_profile.md").read_text(),
        "traces_left": sorted(p.name for p in (out / "profile" / "traces").iterdir()),
    }
    result_file.write_text(json.dumps(result))


if __name__ == "__main__":
    main(*map(Path, sys.argv[1:3]))
