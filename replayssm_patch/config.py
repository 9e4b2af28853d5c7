"""The plugin's knobs, read from vLLM's ``--additional-config '{"replayssm": {...}}'`` and validated.

Why here and not at ``register()``: vLLM loads general plugins before it has parsed the server's config,
so the knobs are read at the first hook that receives a ``VllmConfig`` (model-class methods, layer init).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

CONFIG_KEY = "replayssm"
MIN_BUFFER_LEN = 2
MAX_BUFFER_LEN = 64
DEFAULT_BUFFER_LEN = 16


class ReplaySSMConfigError(ValueError):
    """A bad ``replayssm`` entry in ``--additional-config``; the message names the fix."""


@dataclass(frozen=True)
class ReplaySSMConfig:
    enable: bool = False
    buffer_len: int = DEFAULT_BUFFER_LEN  # under speculation, unless given: speculative_buffer_len
    split_precision: bool = False
    # A sequence's first window ends at L-1 - (hash(slot) mod L), so a cohort admitted together does not flush in
    # one step (off: every window is L steps, aligned to the prefill; for tests that follow exact cursors).
    stagger_windows: bool = True
    # A step with prefills runs vLLM's own path for its decode rows too, after folding their rings. Why: such steps
    # run eagerly, and on the H200 the GDN replay's per-layer launches made them 7 % longer in host time
    # (gpu/results/churn_step-h200-qwen3.5-4b-run1.json); the fold is one launch per layer instead. Measured in
    # session 13 (gpu/results/churn_step-h200-qwen3.5-4b.json): it does not recover that time (mixed steps 1.22-1.25x
    # the baseline's against the replay's 1.25-1.29x), so it stays off by default.
    native_mixed_steps: bool = False
    # Every KV-cache group builds its own metadata and ring plan, as before session 14 (Gated DeltaNet) and session 26
    # (Mamba-2 under speculation), instead of the later groups taking the first's (``update_block_table``). Off by
    # default; it exists so the two can be compared on one GPU host.
    per_group_builds: bool = False
    # Gated DeltaNet: the decode rows of a step with prefills run one launch per layer (``gdn_mixed_decode``: the
    # causal conv, coefficients and replay or fold together) instead of vLLM's conv update and the replay's three.
    # Why: such steps run eagerly and were host-bound on the H200, with ~40 us of Python per launch; the four
    # launches made ReplaySSM's mixed step 25-29 % longer (BENCHMARKS.md, sessions 13-14). Measured in session 15
    # (results/churn_step-h200-qwen3.5-4b-run4/5.json): mixed step 0.94x the baseline's with one launch, 1.30x with
    # four, on one host. Off: the four launches, the control arm.
    gdn_one_launch_mixed: bool = True


DISABLED = ReplaySSMConfig()
_FIELDS = {
    "enable": bool,
    "buffer_len": int,
    "split_precision": bool,
    "stagger_windows": bool,
    "native_mixed_steps": bool,
    "per_group_builds": bool,
    "gdn_one_launch_mixed": bool,
}


def parse_replayssm_config(additional_config: Any) -> ReplaySSMConfig:
    """Validate ``additional_config["replayssm"]``; absent means disabled (vLLM's own behaviour)."""
    if not additional_config or CONFIG_KEY not in additional_config:
        return DISABLED
    raw = additional_config[CONFIG_KEY]
    if not isinstance(raw, dict):
        raise ReplaySSMConfigError(
            f"--additional-config {CONFIG_KEY!r} must be an object such as "
            '{"enable": true, "buffer_len": 16, "split_precision": false}, got ' + repr(raw)
        )
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise ReplaySSMConfigError(f"unknown {CONFIG_KEY} option(s) {unknown}; allowed: {sorted(_FIELDS)}")
    for name, kind in _FIELDS.items():
        # bool is a subclass of int: reject true/false for buffer_len explicitly.
        if name in raw and (type(raw[name]) is not kind):
            raise ReplaySSMConfigError(
                f"{CONFIG_KEY}.{name} must be a JSON {'boolean' if kind is bool else 'integer'}, got {raw[name]!r}"
            )
    config = ReplaySSMConfig(**raw)
    if not MIN_BUFFER_LEN <= config.buffer_len <= MAX_BUFFER_LEN:
        raise ReplaySSMConfigError(
            f"{CONFIG_KEY}.buffer_len must be between {MIN_BUFFER_LEN} and {MAX_BUFFER_LEN}, got "
            f"{config.buffer_len}; 16 is the tested default"
        )
    return config


def replayssm_config_of(vllm_config: Any) -> ReplaySSMConfig:
    """The knobs of a ``VllmConfig`` (anything with ``additional_config``). Under speculative decoding a ring whose
    length was not given fills the tile the kernels pad its L + T entries to (``speculative_buffer_len``)."""
    raw = getattr(vllm_config, "additional_config", None)
    config = parse_replayssm_config(raw)
    verify_len = verify_len_of(vllm_config)
    if config.enable and verify_len and "buffer_len" not in raw[CONFIG_KEY]:
        return replace(config, buffer_len=speculative_buffer_len(verify_len))
    return config


def speculative_buffer_len(verify_len: int) -> int:
    """The default L under speculation: the kernels pad L + T to a power of two, so L = that power less T costs the
    verify no larger tile and folds each row less often (MTP k = 3: L = 28, a fold every ~10 verifies at AL 3
    instead of every ~6). Session 22 on one H200, Nemotron-H-8B: the verify step 257.8 against 278.3 µs at batch
    128; 17,752 against 17,017 tok/s at batch 128 and 19,074 against 18,405 at each ring's capacity; the longer
    ring holds 622 requests of 2,048 tokens against 657 (native spec 228)."""
    return (1 << (DEFAULT_BUFFER_LEN + verify_len - 1).bit_length()) - verify_len


def verify_len_of(vllm_config: Any) -> int:
    """T = 1 + num_speculative_tokens, the most query tokens a verify row holds, under speculative decoding; else 0.

    The ring then holds buffer_len + T entries, so a window of buffer_len committed entries still takes a verify.
    """
    spec = getattr(vllm_config, "speculative_config", None)
    tokens = getattr(spec, "num_speculative_tokens", None) if spec is not None else None
    return 1 + tokens if tokens else 0
