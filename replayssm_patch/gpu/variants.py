"""The arms every GPU script compares, as vLLM ``additional_config`` values, and vLLM's two compile modes.

One table, so the engine-side step, the profile, the serve check and the shell stages of tools/gpu enable
the plugin with the same knobs:

    python3 -m replayssm_patch.gpu.variants replayssm_fp32     # prints the --additional-config JSON ({} for baseline)
    python3 -m replayssm_patch.gpu.variants --mode O0          # the server flags of a compile mode, one a line
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

VARIANTS: dict[str, dict[str, Any] | None] = {
    "baseline": None,
    "replayssm_fp32": {"replayssm": {"enable": True, "buffer_len": 16, "split_precision": False}},
    "replayssm_split": {"replayssm": {"enable": True, "buffer_len": 16, "split_precision": True}},
}

# The speculative-decoding benchmark's four arms (gpu/spec_step.py): a variant above, with or without speculation
# (MTP with synthetic acceptance), so native and ReplaySSM speculate with the same drafter and knobs.
SPEC_ARMS: dict[str, tuple[str, bool]] = {
    "native_standard": ("baseline", False),
    "native_spec": ("baseline", True),
    "replayssm_standard": ("replayssm_fp32", False),
    "replayssm_spec": ("replayssm_fp32", True),
}

# O0: no torch.compile, full CUDA graphs for decode only (the calibration's setting, fastest start-up).
# default: vLLM's own defaults (torch.compile, FULL_AND_PIECEWISE graphs), what production runs.
O0_COMPILATION = {"cudagraph_mode": "FULL_DECODE_ONLY"}
MODES: dict[str, dict[str, Any]] = {
    "O0": {"optimization_level": 0, "compilation_config": O0_COMPILATION},
    "default": {},
}


def server_flags(mode: str) -> list[str]:
    """`vllm serve` flags equivalent to MODES[mode] (the API server spells them -O0 and -cc JSON)."""
    return ["-O0", "-cc", json.dumps(O0_COMPILATION, separators=(",", ":"))] if mode == "O0" else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variant", nargs="?", choices=list(VARIANTS))
    parser.add_argument("--mode", choices=list(MODES))
    args = parser.parse_args(argv)
    if (args.variant is None) == (args.mode is None):
        parser.error("give a variant or --mode MODE")
    if args.variant is not None:
        print(json.dumps(VARIANTS[args.variant] or {}, separators=(",", ":")))
    else:
        for flag in server_flags(args.mode):  # one a line, for bash's `mapfile -t FLAGS < <(...)`
            print(flag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
