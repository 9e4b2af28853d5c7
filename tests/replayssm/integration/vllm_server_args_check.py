"""What tools/gpu hands vLLM's OpenAI server, through vllm==0.24.0's own parsers: each model family's server flags
(replayssm_patch.gpu.variants --family) and compile mode flags, and the request body of `replaybench agree`.

Run by test_vllm_gpu_stages.py in the cached CPU venv. Args: Nemotron-H-8B model dir, Qwen3.5-4B model dir,
result file. Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform

platforms.current_platform = CpuPlatform()  # no GPU here
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.entrypoints.openai.cli_args import make_arg_parser  # noqa: E402
from vllm.entrypoints.openai.completion.protocol import CompletionRequest, CompletionResponseChoice  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402

from harness.experiment.openai_http import exact_completion_body  # noqa: E402
from replayssm_patch.gpu.variants import MODES, family_flags, server_flags  # noqa: E402


def served(model_dir: Path, mode: str) -> dict:
    """The engine arguments vLLM's server builds from `--model DIR`, the family's flags and the mode's."""
    argv = ["--model", str(model_dir), *family_flags(model_dir), *server_flags(mode)]
    engine = EngineArgs.from_cli_args(make_arg_parser(FlexibleArgumentParser()).parse_args(argv))
    return {
        "flags": family_flags(model_dir),
        "language_model_only": engine.language_model_only,
        "gdn_prefill_backend": engine.gdn_prefill_backend,
    }


def agreement_request() -> dict:
    request = CompletionRequest.model_validate(exact_completion_body("m", [11, 12, 13], 512))
    params = request.to_sampling_params(512)
    return {
        "prompt": request.prompt,
        "return_token_ids": request.return_token_ids,
        "stream": request.stream,
        **{k: getattr(params, k) for k in ("max_tokens", "min_tokens", "ignore_eos", "temperature")},
        "choice_has_token_ids": "token_ids" in CompletionResponseChoice.model_fields,
    }


def main(nemotron: Path, qwen: Path, result: Path) -> None:
    models = {"nemotron": nemotron, "qwen": qwen}
    out = {f"{name}/{mode}": served(path, mode) for name, path in models.items() for mode in MODES}
    result.write_text(json.dumps(out | {"agreement_request": agreement_request()}))


if __name__ == "__main__":
    main(*map(Path, sys.argv[1:4]))
