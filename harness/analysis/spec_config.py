"""The speculative decoding an arm's server command line sets up, so the report can put the AL as configured
beside the AL the server measured.

vLLM 0.24 takes it as JSON in `--speculative-config` (or `-sc`): `method`, `num_speculative_tokens` and,
for benchmarks with random weights, `rejection_sample_method: "synthetic"` with either
`synthetic_acceptance_length` or `synthetic_acceptance_rates` (per-position *unconditional* rates, so the
mean acceptance length is 1 + their sum). With the standard rejection sampler the acceptance comes from the
model and is not configured. The embedded engine takes `--spec-tokens K [--acceptance-length AL]` (AL k + 1
when omitted). Commands wrapped in a shell string (`bash -c "vllm serve ..."`) are split as a shell would.
"""

from __future__ import annotations

import json
import shlex

from harness.analysis.model import Speculation

VLLM_FLAGS = ("--speculative-config", "-sc")
SIM_TOKENS, SIM_ACCEPTANCE = "--spec-tokens", "--acceptance-length"


def _arguments(command: list[str]) -> list[str]:
    """The argv, with any argument that is itself a shell command line split into its words."""
    words: list[str] = []
    for argument in command:
        if any(flag in argument for flag in (*VLLM_FLAGS, SIM_TOKENS)) and " " in argument.strip():
            try:
                words += shlex.split(argument)
                continue
            except ValueError:
                pass
        words.append(argument)
    return words


def _option(words: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the last `--name VALUE` or `--name=VALUE` among `words`, else None."""
    value = None
    for index, word in enumerate(words):
        name, equals, inline = word.partition("=")
        if name in names:
            value = inline if equals else (words[index + 1] if index + 1 < len(words) else None)
    return value


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _from_vllm(text: str) -> Speculation:
    try:
        config = json.loads(text)
    except json.JSONDecodeError:
        return Speculation(note=f"--speculative-config is not JSON ({text[:60]!r}): configured AL unknown")
    if not isinstance(config, dict):
        return Speculation(note="--speculative-config is not a JSON object: configured AL unknown")
    tokens = _number(config.get("num_speculative_tokens"))
    length = _number(config.get("synthetic_acceptance_length"))
    rates = config.get("synthetic_acceptance_rates")
    if length is None and isinstance(rates, list) and all(_number(r) is not None for r in rates):
        length = 1 + sum(float(r) for r in rates)
    synthetic = config.get("rejection_sample_method") == "synthetic"
    return Speculation(
        method=str(config["method"]) if "method" in config else None,
        tokens=int(tokens) if tokens is not None else None,
        acceptance_length=length if synthetic else None,
        note="" if synthetic else "acceptance decided by the model (standard rejection sampling)",
    )


def configured_speculation(command: list[str] | None) -> Speculation | None:
    """What the command line configures; None when it sets up no speculative decoding (or is unknown)."""
    if not command:
        return None
    words = _arguments(command)
    vllm = _option(words, VLLM_FLAGS)
    if vllm is not None:
        return _from_vllm(vllm)
    tokens = _option(words, (SIM_TOKENS,))
    try:
        k = int(tokens) if tokens is not None else 0
        length = float(_option(words, (SIM_ACCEPTANCE,)) or k + 1)
    except ValueError:
        return Speculation(note=f"{SIM_TOKENS} / {SIM_ACCEPTANCE} are not numbers: configured AL unknown")
    return Speculation(method="synthetic (serve-sim)", tokens=k, acceptance_length=length) if k > 0 else None
