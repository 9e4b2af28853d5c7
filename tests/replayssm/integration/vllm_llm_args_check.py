"""The GPU benchmarks' `vllm.LLM(...)` arguments through the real vllm==0.24.0 constructor, up to the engine config.

Run by test_vllm_gpu_stages.py in the cached CPU venv. Args: Nemotron-H-8B model dir, the same with an MTP
layer (spec_step's arms), result file. The
engine itself cannot start without a GPU, so `LLMEngine.from_engine_args` is stopped with the EngineArgs that
LLM built; those then build the VllmConfig. Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform

platforms.current_platform = CpuPlatform()  # no GPU here; vLLM's CPU platform builds configs
import vllm.entrypoints.llm as llm_module  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

from replayssm_patch.config import replayssm_config_of, verify_len_of  # noqa: E402
from replayssm_patch.gpu import engine_step, host_floor, spec_step, step_profile  # noqa: E402
from replayssm_patch.gpu.variants import MODES, SPEC_ARMS, VARIANTS  # noqa: E402
from replayssm_patch.refusals import unsupported_settings  # noqa: E402


class Built(Exception):
    """Carries the EngineArgs out of LLM.__init__ before the engine would start."""


def stop_before_engine(engine_args, usage_context=None, **_):
    raise Built(engine_args)


def constructed(kwargs: dict) -> dict:
    try:
        LLM(**kwargs)
    except Built as built:
        args = built.args[0]
    else:
        raise AssertionError("LLM started an engine on CPU")
    # the CPU platform rewrites compile settings, so record what LLM passed on, then build the config
    given = {
        "optimization_level": int(args.optimization_level),
        "cudagraph_mode": str(args.compilation_config.cudagraph_mode),
        "enable_prefix_caching": args.enable_prefix_caching,
        "disable_log_stats": args.disable_log_stats,
        "load_format": args.load_format,
        "profiler": args.profiler_config.profiler,
        "profiler_with_stack": args.profiler_config.torch_profiler_with_stack,
        "capture_sizes": args.compilation_config.cudagraph_capture_sizes,
        "language_model_only": getattr(args, "language_model_only", None),
        "gdn_prefill_backend": getattr(args, "gdn_prefill_backend", None),
    }
    config = dataclasses.replace(args, skip_tokenizer_init=True).create_engine_config()
    return given | {
        "config_optimization_level": int(config.optimization_level),
        "config_prefix_caching": config.cache_config.enable_prefix_caching,
        "mamba_ssm_cache_dtype": config.cache_config.mamba_ssm_cache_dtype,
        "gpu_memory_utilization": config.cache_config.gpu_memory_utilization,
        "max_num_seqs": config.scheduler_config.max_num_seqs,
        "max_model_len": config.model_config.max_model_len,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "replayssm": dataclasses.asdict(replayssm_config_of(config)),
        "hidden_size": config.model_config.hf_text_config.hidden_size,
        "layers": config.model_config.hf_text_config.num_hidden_layers,
        **speculation(config),
    }


def speculation(config) -> dict:
    """The resolved SpeculativeConfig (vLLM turns synthetic_acceptance_length into per-position rates), the verify
    length the plugin sizes its ring for and the plugin's refusals of this config (none expected)."""
    spec, resolved = config.speculative_config, None
    if spec is not None:
        resolved = {k: getattr(spec, k) for k in ("method", "num_speculative_tokens", "rejection_sample_method",
                                                  "synthetic_acceptance_rates")}  # fmt: skip
        resolved["draft_architectures"] = list(spec.draft_model_config.architectures)
    refused = unsupported_settings(config, replayssm_config_of(config).split_precision)
    return {"speculative": resolved, "verify_len": verify_len_of(config), "refused": refused}


def main(model_dir: Path, mtp_dir: Path, qwen_dir: Path, result: Path) -> None:
    llm_module.LLMEngine.from_engine_args = stop_before_engine
    out: dict = {"cases": {}}
    for variant in VARIANTS:
        for mode in MODES:
            args = engine_step.parser().parse_args(["--model", str(model_dir), "--variant", variant, "--mode", mode,
                                                    "--out", str(result.parent / "unused.json")])  # fmt: skip
            out["cases"][f"{variant}/{mode}"] = constructed(engine_step.llm_kwargs(args))
    for arm, length in zip(SPEC_ARMS, (3.0, 3.0, 2.8, 2.8, 2.8, 2.8, 2.8, 2.8), strict=True):
        spec = spec_step.parse_args(["--model", str(mtp_dir), "--arm", arm, "--mode", "default", "--acceptance-length",
                                     str(length), "--out", str(result.parent / "unused.json")])  # fmt: skip
        out["cases"][f"{arm}/{length:g}"] = constructed(engine_step.llm_kwargs(spec) | spec_step.arm_kwargs(spec))
    profiled = engine_step.llm_kwargs(args) | {"profiler_config": step_profile.profiler_config(result.parent / "t")}
    out["profiled"] = constructed(profiled)
    floor_dir = result.parent / "floor"
    assert host_floor.main(["--model", str(model_dir), "--out", str(floor_dir)]) == 0
    floor_argv = ["--model", str(floor_dir), "--variant", "replayssm_fp32", "--mode", "default"]
    floor_args = engine_step.parser().parse_args([*floor_argv, "--out", str(result.parent / "unused.json")])
    out["floor"] = constructed(engine_step.llm_kwargs(floor_args))
    qwen_floor = result.parent / "qwen-floor"
    assert host_floor.main(["--model", str(qwen_dir), "--out", str(qwen_floor)]) == 0
    qwen_floor_argv = ["--model", str(qwen_floor), "--variant", "replayssm_fp32", "--mode", "default"]
    qwen_floor_args = engine_step.parser().parse_args([*qwen_floor_argv, "--out", str(result.parent / "unused.json")])
    out["qwen_floor"] = constructed(engine_step.llm_kwargs(qwen_floor_args))
    for variant in ("baseline", "replayssm_fp32"):  # the gdn:V jobs' engine (Qwen3.5: text only, Triton GDN prefill)
        qwen_argv = ["--model", str(qwen_dir), "--variant", variant, "--mode", "default"]
        qwen_args = engine_step.parser().parse_args([*qwen_argv, "--out", str(result.parent / "unused.json")])
        out[f"qwen/{variant}"] = constructed(engine_step.llm_kwargs(qwen_args))
    params = SamplingParams(**engine_step.sampling_kwargs(272))
    out["sampling"] = {k: getattr(params, k) for k in ("max_tokens", "min_tokens", "ignore_eos", "temperature",
                                                        "detokenize")}  # fmt: skip
    out["prompt"] = TokensPrompt(prompt_token_ids=[11, 12])["prompt_token_ids"]
    out["llm_methods"] = sorted(
        m for m in ("generate", "start_profile", "stop_profile", "apply_model", "get_metrics") if hasattr(LLM, m)
    )
    result.write_text(json.dumps(out))


if __name__ == "__main__":
    main(*map(Path, sys.argv[1:5]))
