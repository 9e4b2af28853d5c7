"""spec_step.py's whole flow in the vLLM CPU venv, against engine_step's stand-in for `vllm.LLM` that counts like
vLLM's engine does: every emulated step goes through vLLM 0.24's own PrometheusStatLogger (a real VllmConfig with
the MTP drafter and synthetic acceptance), so spec_step reads real vllm:spec_decode_* and iteration series from the
same registry a GPU run has.

The stand-in decodes the way synthetic acceptance does at an integer AL: a prefill step gives every request its
first token, then each step drafts k tokens per request and accepts floor(AL) - 1 of them. A fractional AL is
thereby under-accepted on purpose (2.5 accepts as 2.0), which the AL check must catch. It reports vLLM's KV
capacity as native spec keeps it, 1 + k state blocks per request (ReplaySSM: one).
Args: Nemotron-H-8B + MTP model dir, result file. Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
from pathlib import Path
from typing import ClassVar

import vllm
import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform

platforms.current_platform = CpuPlatform()  # no GPU here; vLLM's CPU platform builds configs
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.v1.metrics.loggers import PrometheusStatLogger  # noqa: E402
from vllm.v1.metrics.stats import IterationStats, SchedulerStats  # noqa: E402
from vllm.v1.spec_decode.metrics import SpecDecodingStats  # noqa: E402

from replayssm_patch.gpu import spec_step  # noqa: E402
from replayssm_patch.gpu.variants import speculative_config  # noqa: E402
from tests.replayssm.integration.vllm_engine_flow_check import StandInLLM  # noqa: E402

CONCURRENCY = 96.0  # requests of max_model_len the stand-in's KV cache holds with one state block per request
STEP_S = 0.001  # wall time per emulated step, so that 272 tokens take longer than 16


class CountingStandIn(StandInLLM):
    """StandInLLM whose generates are counted step by step through vLLM's Prometheus logger."""

    config: ClassVar = None  # one VllmConfig for every stand-in (building one takes seconds)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        spec = kwargs.get("speculative_config")
        self.k = spec["num_speculative_tokens"] if spec else 0
        self.per_step = int(spec["synthetic_acceptance_length"]) if spec else 1
        native = "additional_config" not in kwargs
        cache = self.config.cache_config
        cache.kv_cache_max_concurrency = CONCURRENCY / (1 + self.k) if native else CONCURRENCY
        cache.kv_cache_size_tokens = int(cache.kv_cache_max_concurrency * self.config.model_config.max_model_len)
        cache.num_gpu_blocks = 1000
        engine = self.llm_engine
        engine.vllm_config = self.config
        engine.admit_per_step, engine.tokens_per_step, engine.wall_s_per_step = 10**6, self.per_step, STEP_S
        engine.on_step = self._count_step
        self.prometheus = PrometheusStatLogger(self.config, [0])  # unregisters the previous engine's series

    def _count_step(self, decoding: int, generated: int) -> None:
        """One engine step through vLLM's logger: each decoding row drafted k tokens and accepted AL - 1."""
        spec = SpecDecodingStats.new(self.k) if self.k and decoding else None
        for _ in range(decoding if spec else 0):
            spec.observe_draft(num_draft_tokens=self.k, num_accepted_tokens=self.per_step - 1)
        stats = IterationStats()
        stats.num_generation_tokens = generated
        self.prometheus.record(scheduler_stats=SchedulerStats(spec_decoding_stats=spec), iteration_stats=stats)

    def generate(self, prompts, params, use_tqdm=True):
        """The warm-up's generate, stepped through the stand-in engine so it is counted alike."""
        outputs = super().generate(prompts, params, use_tqdm)
        left, steps = params.max_tokens - 1, 1
        self._count_step(0, len(prompts))  # the prefill step: every request's first token
        while left > 0:
            emitted = min(self.per_step, left)
            self._count_step(len(prompts), len(prompts) * emitted)
            left, steps = left - emitted, steps + 1
        time.sleep(STEP_S * steps)
        return outputs


def main(model: Path, result_file: Path) -> None:
    args = EngineArgs(model=str(model), load_format="dummy", skip_tokenizer_init=True, max_model_len=2048,
                      speculative_config=speculative_config(3, 3.0))  # fmt: skip
    CountingStandIn.config = args.create_engine_config()
    vllm.LLM = CountingStandIn
    out = result_file.parent / "spec_step.json"
    common = ["--model", str(model), "--mode", "default", "--max-model-len", "2048", "--out", str(out)]
    runs = {
        "replayssm_spec": [*common, "--arm", "replayssm_spec", "--batches", "4,8"],
        "native_spec": [*common, "--arm", "native_spec", "--batches", "4"],
        "native_standard": [*common, "--arm", "native_standard", "--batches", "4"],
        "replayssm_spec_2.5": [*common, "--arm", "replayssm_spec", "--acceptance-length", "2.5", "--batches", "4"],
    }
    profiled = result_file.parent / "profile"
    runs["profiled"] = [
        *common[:-1], str(result_file.parent / "profiled_rows.json"), "--arm", "replayssm_spec", "--batches", "4",
        "--repeats", "1", "--profile-batches", "4", "--profile-out", str(profiled),
    ]  # fmt: skip
    result: dict = {"exits": {}, "kwargs": {}, "calls": {}}
    for name, argv in runs.items():
        CountingStandIn.made.clear()
        result["exits"][name] = spec_step.main(argv)
        result["kwargs"][name] = {k: str(v) for k, v in CountingStandIn.made[0].kwargs.items()}
        result["calls"][name] = CountingStandIn.made[0].calls
    result["profile_file"] = json.loads((profiled / "step_profile.json").read_text())
    result["profile_md"] = (profiled / "step_profile.md").read_text()
    result["token_budget"] = CountingStandIn.config.scheduler_config.max_num_batched_tokens
    summary = io.StringIO()
    with contextlib.redirect_stdout(summary):
        result["summarise_exit"] = spec_step.main(["--summarise", str(out)])
    result |= {"file": json.loads(out.read_text()), "summary": summary.getvalue()}
    result_file.write_text(json.dumps(result))


if __name__ == "__main__":
    main(*map(Path, sys.argv[1:3]))
