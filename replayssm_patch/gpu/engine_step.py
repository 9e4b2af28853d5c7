"""Engine-side decode step of vLLM 0.24 (offline `LLM.generate`, no HTTP): the source of every decode-step figure.

    export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1   # tools/gpu/session.sh does
    python3 -m replayssm_patch.gpu.engine_step --model MODEL_DIR --variant replayssm_fp32 --mode default \
        --batches 64,256 --out replayssm_patch/gpu/results/engine_step-h200.json

Method (the one of ../shared/gpu/calibration/h200-2026-12-01-engine-vs-http.json): B prompts of 1024 random
token ids generated with exactly 16 and exactly 272 output tokens (ignore_eos, min_tokens = max_tokens, greedy,
no detokenisation); step = (t272 - t16) / 256, so prefill and start-up cancel and flush steps are included.
Each batch gets one warm-up generate, then 3 repeats whose order alternates (16, 272 / 272, 16 / ...).
The row holds the median step and the spread (max - min) of the repeats, and whether it is valid (the median,
because one repeat can hold a one-time stall such as a kernel compiled mid-run: seen on the H200 as a short
generate 1.3 s slower than its twins, which makes that repeat's step look far too fast):
- every output has the exact length;
- no request was preempted;
- in every 272-token generate the whole batch ran at once: the engine's timestamps show some moment with
  every first token out and no last one yet (a KV cache too small for B runs the batch in waves).
The row also holds the decode window (decode_window.py): the timed generates step vLLM's engine themselves and
read the engine core's timestamp of every step, so window_step_ms is the mean whole-batch decode step measured on
the engine's clock with no prefill in it (the median over repeats; window_spread_ms, window_p90_ms,
window_tokens_per_s, window_steps beside it). At large batches the prefill's jitter lands in (t272 - t16) but not
here. And engine_tpot_ms, the mean per-request TPOT of the 272-token generates from vLLM's engine-core
timestamps. Unlike the step, it includes the steps that early requests decode beside later ones' chunked
prefill; it is the figure that a client's TPOT of the same load compares with. Every generate has fresh
prompts and prefix caching is off, so no call reuses another's prefill. Each row also keeps what the machine did
while its batch ran (``conditions``, machine_sampling.py: host CPU, the GPU's SM clock against its maximum).

One variant (replayssm_patch/gpu/variants.py) and one compile mode per run: O0 is `-O0` with cudagraph_mode
FULL_DECODE_ONLY (the calibration's), default is vLLM's own (torch.compile, FULL_AND_PIECEWISE). Rows merge
into --out by (variant, mode, batch) (row_file.py); one line is printed per row as it is measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from replayssm_patch.gpu.decode_window import DecodeWindow, decode_window, observed_step
from replayssm_patch.gpu.machine_sampling import sampled_conditions, sampling, telemetry_path
from replayssm_patch.gpu.row_file import RowFileError, read_row_file, record_row
from replayssm_patch.gpu.variants import MODES, VARIANTS, model_family_kwargs

SHORT_TOKENS, LONG_TOKENS = 16, 272
PROMPT_TOKENS = 1024
REPEATS = 3
DEFAULT_BATCHES = (64, 256)
FIT = "fit"  # in --batches: the largest batch the engine's KV cache holds, known once it has started
# `fit` runs the largest multiple of FIT_STEP the engine holds, and every such multiple up to --max-num-seqs gets a
# CUDA graph: a batch between captured sizes runs the next larger graph, padded (session 19: native speculation's 222
# rows ran the 3,072-token verify graph, 3.2x their 888 tokens, and looked 3x slower per step than at 128).
FIT_STEP = 32
FIRST_TOKEN_ID = 10  # ids below are the tokenizer's specials (../shared/gpu/make-tokenizer.py: pad, bos, eos, unk)
G = TypeVar("G")  # what one timed generate gives (engine_step: Generated; spec_step: it with the counters)
T = TypeVar("T")
WHAT = (
    "Engine-side decode step (vLLM LLM.generate, no HTTP): B prompts of prompt_tokens random token ids with "
    f"exactly {SHORT_TOKENS} and exactly {LONG_TOKENS} output tokens (ignore_eos, min_tokens = max_tokens, greedy); "
    f"per repeat step = (t{LONG_TOKENS} - t{SHORT_TOKENS}) / {LONG_TOKENS - SHORT_TOKENS}, so prefill cancels and "
    "flush steps are included; step_ms = median of the repeats, spread_ms = their max - min. window_step_ms = "
    f"median over repeats of the mean period between consecutive engine steps of the {LONG_TOKENS}-token generate "
    "while the whole batch decoded (engine-core timestamps, from the last first token to the first last token: no "
    "prefill inside), window_spread_ms their max - min, window_p90_ms the median p90, window_tokens_per_s the "
    "median of the tokens emitted in the window over its length. engine_tpot_ms = mean "
    f"per-request TPOT of the {LONG_TOKENS}-token generates from vLLM's engine-core timestamps (includes decode "
    "steps beside other requests' prefill). Written by replayssm_patch/gpu/engine_step.py."
)

ROW_FACTS = ("replayssm_layers", "launch_shapes", "profiler_configured", "max_concurrency", "startup_s", "gpu", "vllm",
             "date", "gpu_uuid", "cpu_model")  # fmt: skip


@dataclass(frozen=True)
class Repeat:
    """One pair of timed generates (seconds), the step it gives, and the long generate's decode window."""

    t_short_s: float
    t_long_s: float
    step_ms: float
    window: DecodeWindow | None = None


def parse_batches(text: str) -> tuple[int, ...]:
    """'64,256' -> (64, 256); argparse shows a bad value's message as one line."""
    try:
        batches = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        batches = ()
    if not batches or min(batches) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive batch sizes joined by commas, e.g. 64,256")
    return batches


def parse_engine_batches(text: str) -> tuple[int | str, ...]:
    """parse_batches, where 'fit' may stand for the largest batch the started engine holds (resolved_batches)."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    try:
        numbers = parse_batches(",".join(p for p in parts if p != FIT)) if set(parts) - {FIT} else ()
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give positive batch sizes joined by commas, e.g. 64,256, or {FIT} for the largest that fits"
        ) from None
    if not parts:
        raise argparse.ArgumentTypeError(f"{text!r}: give batch sizes joined by commas, e.g. 64,256 (or {FIT})")
    return numbers + ((FIT,) if FIT in parts else ())


def sized_batches(args: argparse.Namespace) -> list[int]:
    """The batches whose steps get a CUDA graph, known before start-up: the numbers given and, for `fit`, every
    multiple of FIT_STEP up to --max-num-seqs (one of them is the batch `fit` resolves to)."""
    ladder = range(FIT_STEP, args.max_num_seqs + 1, FIT_STEP) if FIT in args.batches else ()
    return sorted({*(b for b in args.batches if b != FIT), *ladder})


def resolved_batches(batches: Sequence[int | str], concurrency: float | None, max_num_seqs: int) -> list[int]:
    """``batches`` with `fit` as the largest batch the engine holds: vLLM's maximum concurrency (requests of
    max_model_len tokens its KV cache holds, so a run's shorter requests fit too), at most --max-num-seqs, rounded
    down to a multiple of FIT_STEP (a captured size); repeats dropped, order kept. `fit` is dropped, after a line
    saying so, when vLLM gave no concurrency or it is under FIT_STEP."""
    resolved = []
    for batch in batches:
        if batch == FIT:
            largest = 0 if concurrency is None else min(int(concurrency), max_num_seqs) // FIT_STEP * FIT_STEP
            if not largest:
                why = "vLLM reported no maximum concurrency" if concurrency is None else f"it holds < {FIT_STEP}"
                print(f"skipped {FIT}: {why}", flush=True)
                continue
            batch = largest
            print(f"{FIT}: batch {batch} (vLLM's maximum concurrency {concurrency:.1f}, --max-num-seqs "
                  f"{max_num_seqs}, down to a multiple of {FIT_STEP}: a captured size)", flush=True)  # fmt: skip
        if batch not in resolved:
            resolved.append(int(batch))
    return resolved


def engine_batches(llm: Any, args: argparse.Namespace, batches: Sequence[int | str] | None = None) -> list[int]:
    """``batches`` (default --batches) as the started engine runs them: `fit` resolved (resolved_batches)."""
    return resolved_batches(args.batches if batches is None else batches, max_concurrency(llm), args.max_num_seqs)


def max_concurrency(llm: Any) -> float | None:
    """vLLM's "Maximum concurrency for N tokens per request" (N = max_model_len), as its engine core computed it
    from the KV-cache config and handed the front end (cache_config.kv_cache_max_concurrency)."""
    concurrency = llm.llm_engine.vllm_config.cache_config.kv_cache_max_concurrency
    return None if concurrency is None else round(concurrency, 2)


def step_ms(t_short_s: float, t_long_s: float, short: int = SHORT_TOKENS, long: int = LONG_TOKENS) -> float:
    """Milliseconds per decode step from the two generate times: the extra tokens cost only decode steps."""
    return (t_long_s - t_short_s) / (long - short) * 1e3


def repeat_order(repeat: int, short: int = SHORT_TOKENS, long: int = LONG_TOKENS) -> tuple[int, int]:
    """Even repeats time the short generate first, odd ones the long: slow drift cancels over the repeats."""
    return (short, long) if repeat % 2 == 0 else (long, short)


def prompt_token_ids(rng: np.random.Generator, batch: int, length: int, vocab_size: int) -> list[list[int]]:
    """`batch` prompts of `length` uniform random ids in [FIRST_TOKEN_ID, vocab_size), never a special token."""
    if vocab_size <= FIRST_TOKEN_ID:
        raise ValueError(f"vocab_size {vocab_size} leaves no ordinary token ids")
    return rng.integers(FIRST_TOKEN_ID, vocab_size, size=(batch, length)).tolist()


def sampling_kwargs(tokens: int) -> dict[str, Any]:
    """SamplingParams of a generate that produces exactly `tokens` tokens (greedy; text is not needed)."""
    return {"max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True, "temperature": 0.0, "detokenize": False}


def capture_sizes(args: argparse.Namespace) -> list[int]:
    """The token counts of the measured steps: B per decode step, and also B·(1 + k) per verify step when the run
    speculates (spec_step's arms set args.speculative and args.spec_tokens)."""
    per_row = (1, 1 + args.spec_tokens) if getattr(args, "speculative", False) else (1,)
    return sorted({batch * tokens for batch in sized_batches(args) for tokens in per_row})


def compilation_config(args: argparse.Namespace) -> dict[str, Any]:
    """The mode's compilation settings, with CUDA graphs captured only at the steps measured (unless
    --all-capture-sizes): vLLM's default list has ~67 sizes per graph kind, whose capture costs each engine about
    a minute of start-up on the H200, and a step at a captured size runs the same graph either way. The default
    list also stops at 512 tokens, so a verify step of 256 rows of 1 + 3 tokens would run without a graph."""
    config = dict(MODES[args.mode].get("compilation_config", {}))
    if not args.all_capture_sizes:
        config["cudagraph_capture_sizes"] = capture_sizes(args)
    return config


def llm_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM` for the run's variant and mode (checked against vLLM 0.24 in tests/)."""
    extra = VARIANTS[args.variant]
    compilation = compilation_config(args)
    return {
        "model": str(args.model),
        "load_format": "dummy",
        "max_num_seqs": args.max_num_seqs,
        "max_model_len": args.max_model_len,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "mamba_ssm_cache_dtype": args.mamba_ssm_cache_dtype,
        "enable_prefix_caching": False,  # no generate may reuse another's prefill (the plugin refuses it anyway)
        "seed": args.seed,
        "disable_log_stats": False,  # stats on: the preemption counter is read after every batch
        **({"additional_config": extra} if extra else {}),
        **model_family_kwargs(args.model),
        **MODES[args.mode],
        **({"compilation_config": compilation} if compilation else {}),
    }


def median_and_spread(values: Sequence[float], digits: int = 3) -> tuple[float | None, float | None]:
    """A row's figure over its repeats and how far they range: the median (one stalled repeat cannot move it) and
    max - min, rounded; (None, None) without values."""
    if not values:
        return None, None
    return round(statistics.median(values), digits), round(max(values) - min(values), digits)


def timed_repeats(repeats: Sequence[Any]) -> list[Any]:
    """The repeats whose long generate took longer than their short one. A stall in the short one (session 27: 5 s,
    on the spec step's native arm) makes the difference negative: such a repeat measures no step, and it would
    swamp the spread."""
    return [r for r in repeats if r.t_long_s > r.t_short_s]


def make_row(args: argparse.Namespace, batch: int, repeats: Sequence[Repeat], **facts: Any) -> dict[str, Any]:
    """The result row of one batch: median step and spread over the repeats that did not stall, mean generate times
    and every repeat. When every repeat stalled no step was measured: the step is None and the row invalid, as the
    spec step's row has it (a median of negative differences would read as a figure)."""
    timed = timed_repeats(repeats)
    steps = [r.step_ms for r in timed]
    problems = [*facts.pop("problems", [])]
    if not timed:
        problems.append("every repeat stalled (its short generate outlasted its long one): no step measured; run the "
                        "batch again")  # fmt: skip
    step, spread = median_and_spread(steps)
    return {
        "variant": args.variant,
        "mode": args.mode,
        "batch": batch,
        "prompt_tokens": args.prompt_tokens,
        "step_ms": step,
        "spread_ms": spread,
        **window_facts([r.window for r in repeats]),
        f"t{SHORT_TOKENS}_s": round(statistics.fmean(r.t_short_s for r in repeats), 3),
        f"t{LONG_TOKENS}_s": round(statistics.fmean(r.t_long_s for r in repeats), 3),
        "repeats": [repeat_record(r) for r in repeats],
        "stalled_repeats": len(repeats) - len(timed),
        **facts,
        "valid": not problems,
        "problems": problems,
    }


def repeat_record(repeat: Any) -> dict[str, Any]:
    """A repeat dataclass as its row stores it: figures to 4 decimals, its decode window as a dict."""
    return {k: v if k == "window" or v is None else round(v, 4) for k, v in asdict(repeat).items()}


WINDOW_FIELDS = ("window_step_ms", "window_spread_ms", "window_p90_ms", "window_tokens_per_s", "window_steps")


def window_facts(windows: Sequence[DecodeWindow | None]) -> dict[str, Any]:
    """The row's decode-window figures (decode_window.py): the median over repeats of each repeat's mean step,
    the spread of those means, the median p90 and tokens/s, the fewest steps a repeat's window held; None (and 0
    steps) without windows."""
    seen = [w for w in windows if w is not None]
    if not seen:
        return dict.fromkeys(WINDOW_FIELDS) | {"window_steps": 0}
    step, spread = median_and_spread([w.mean_ms for w in seen])
    return {
        "window_step_ms": step,
        "window_spread_ms": spread,
        "window_p90_ms": round(statistics.median(w.p90_ms for w in seen), 3),
        "window_tokens_per_s": round(statistics.median(w.tokens_per_s for w in seen), 1),
        "window_steps": min(w.steps for w in seen),
    }


def row_line(row: dict[str, Any]) -> str:
    """The line printed per row: what the issue's table needs, at a glance."""
    return (
        f"{row['variant']} {row['mode']} B={row['batch']}: {step_text(row['step_ms'], row['spread_ms'])}, window "
        f"step {row.get('window_step_ms')} ms (spread {row.get('window_spread_ms')}, "
        f"{row.get('window_steps')} steps), t{SHORT_TOKENS} {row[f't{SHORT_TOKENS}_s']:.2f} s, t{LONG_TOKENS} "
        f"{row[f't{LONG_TOKENS}_s']:.2f} s, engine TPOT {row.get('engine_tpot_ms')} ms" + invalid_suffix(row)
    )


def step_text(step_ms: float | None, spread_ms: float | None) -> str:
    """A row's step and spread as its line prints them ("step ?" when no repeat measured one)."""
    return "step ?" if step_ms is None else f"step {step_ms:.3f} ms (spread {spread_ms:.3f})"


def invalid_suffix(row: dict[str, Any]) -> str:
    """What a printed row line ends with: nothing when the row is valid, else its problems."""
    return "" if row.get("valid", True) else " INVALID: " + "; ".join(row.get("problems", []))


def engine_options(p: argparse.ArgumentParser, variant: bool = True) -> argparse.ArgumentParser:
    """The engine's options, shared with step_profile.py and spec_step.py (same engine, same defaults); spec_step
    names an arm instead of a variant (variant=False) and sets args.variant from it."""
    p.add_argument("--model", type=Path, required=True, help="dir with config.json (+ tokenizer); weights are dummy")
    if variant:
        p.add_argument("--variant", choices=list(VARIANTS), default="baseline")
    p.add_argument("--mode", choices=list(MODES), default="O0", help="O0: -O0 + FULL_DECODE_ONLY; default: vLLM's")
    p.add_argument("--batches", type=parse_engine_batches, default=DEFAULT_BATCHES,
                   help=f"comma-separated [64,256]; {FIT}: the largest batch the engine's KV cache holds")  # fmt: skip
    p.add_argument("--gpu-memory-utilization", type=float, default=0.45, help="0.45 leaves room for a server")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--mamba-ssm-cache-dtype", default="float32")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and of vLLM")
    p.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS,
                   help=f"prompt length [{PROMPT_TOKENS}]; shorter prompts shrink the prefill, whose run-to-run "
                   "jitter lands in (t272 - t16) at large batches")  # fmt: skip
    p.add_argument("--all-capture-sizes", action="store_true", help="capture vLLM's default CUDA-graph sizes, not "
                   "only the batches measured (slower start-up, same decode graphs)")  # fmt: skip
    return p


def parser() -> argparse.ArgumentParser:
    p = engine_options(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    p.add_argument("--repeats", type=int, default=REPEATS)
    p.add_argument("--budget-s", type=float, default=None, help="start no new batch after this many seconds")
    p.add_argument("--out", type=Path, required=True, help="JSON file to merge the rows into")
    return p


def engine_problem(args: argparse.Namespace) -> str | None:
    """One line naming a bad engine option and its fix, or None."""
    if not (args.model / "config.json").exists():
        return f"{args.model / 'config.json'} missing; give --model a dir holding the model's config.json"
    biggest = max(sized_batches(args))
    if biggest > args.max_num_seqs:
        return f"batch {biggest} exceeds --max-num-seqs {args.max_num_seqs}; raise it or drop the batch"
    if args.prompt_tokens < 1:
        return f"--prompt-tokens must be at least 1 (got {args.prompt_tokens})"
    if args.max_model_len < args.prompt_tokens + LONG_TOKENS:
        need = args.prompt_tokens + LONG_TOKENS
        return f"--max-model-len {args.max_model_len} is below the {need} tokens a request needs"
    return None


def out_problem(path: Path, what: str, prompt_tokens: int) -> str | None:
    """Why rows cannot be merged into ``path``, or None. One file holds one prompt length (the row key leaves it
    out, so a row of another length would replace a row it is not comparable with); a row without the field was
    measured with the only length before it, PROMPT_TOKENS."""
    try:
        rows = read_row_file(path, what)["rows"]
    except RowFileError as exc:
        return str(exc)
    other = sorted({row.get("prompt_tokens", PROMPT_TOKENS) for row in rows} - {prompt_tokens})
    if other:
        return (f"{path} holds rows measured with prompts of {', '.join(map(str, other))} tokens; give --out another "
                f"file for --prompt-tokens {prompt_tokens}")  # fmt: skip
    return None


def layers_problem(variant: str, layers: int | str) -> str | None:
    """A run whose layers are not the variant's measures the wrong thing: say so (None when they match)."""
    if not isinstance(layers, int):
        return None
    if VARIANTS[variant] is None and layers:
        return f"{variant}: {layers} ReplaySSM layers loaded without the knob; the plugin must be inactive here"
    if VARIANTS[variant] is not None and not layers:
        return (f"{variant}: no ReplaySSM layer in the model; the plugin did not load (is its dist-info on "
                "PYTHONPATH? see replayssm_patch/plugin_site.py)")  # fmt: skip
    return None


def launch_shapes_of(variant: str, gpu: str) -> dict[str, str] | None:
    """The replay kernel's launch shapes an arm ran with and their source (None for the baseline): a row's step
    is only comparable with rows of the same shapes."""
    from replayssm_patch.kernels.launch_config import launch_shapes_in_use

    return launch_shapes_in_use(gpu) if VARIANTS[variant] is not None else None


def command_line(module: str, argv: list[str] | None) -> str:
    return f"python3 -m {module} " + shlex.join(sys.argv[1:] if argv is None else argv)


@dataclass(frozen=True)
class Generated:
    """One timed generate."""

    seconds: float
    exact: bool  # every output has exactly the tokens asked for
    tpots_s: list[float]  # per request, from the engine's timestamps
    together: bool | None  # the whole batch was running at one moment (None: no engine stats)
    window: DecodeWindow | None = None  # its whole-batch decode steps (stepped_generate only)


def engine_tpot_s(stats: Any) -> float | None:
    """One request's TPOT from vLLM's engine-core timestamps (RequestOutput.metrics with stats on), else None."""
    tokens = getattr(stats, "num_generation_tokens", 0)
    first, last = getattr(stats, "first_token_ts", 0.0), getattr(stats, "last_token_ts", 0.0)
    return (last - first) / (tokens - 1) if tokens > 1 and last > first > 0 else None


def batch_ran_together(stats: Sequence[Any]) -> bool | None:
    """Whether at some moment every request had its first token and none had its last: a batch larger than the
    KV cache holds runs in waves instead (False), and its step is not the step at that batch."""
    firsts = [getattr(s, "first_token_ts", 0.0) for s in stats]
    lasts = [getattr(s, "last_token_ts", 0.0) for s in stats]
    if not stats or min(firsts) <= 0:
        return None
    return max(firsts) < min(lasts)


def run_checks(runs: Sequence[tuple[int, Generated]], preempted: int | None) -> dict[str, Any]:
    """The row's validity facts over a batch's timed generates; `problems` is empty for a valid row."""
    long = [g for tokens, g in runs if tokens == LONG_TOKENS]
    problems = []
    if not all(g.exact for _, g in runs):
        problems.append("some outputs were not of the exact length asked")
    if preempted is None:
        problems.append("vLLM's preemption counter was unreadable")
    elif preempted:
        problems.append(f"{preempted} preemptions: raise --gpu-memory-utilization")
    together = [g.together for g in long]
    if None in together:
        problems.append("no engine timestamps: cannot tell whether the batch ran at once")
    elif not all(together):
        problems.append("the batch did not run at once (KV cache too small?): raise --gpu-memory-utilization")
    tpots = [t for g in long for t in g.tpots_s]
    return {
        "engine_tpot_ms": round(statistics.fmean(tpots) * 1e3, 3) if tpots else None,
        "engine_tpot_tokens": LONG_TOKENS,
        "exact": all(g.exact for _, g in runs),
        "preemptions": preempted,
        "valid": not problems,
        "problems": problems,
    }


# ---- on the GPU host: everything below imports vLLM or torch --------------------------------------------------


REPLAY_LAYER_CLASSES = ("ReplayMambaMixer2", "ReplayGatedDeltaNet")


def count_replay_layers(model: Any) -> int:
    """Runs inside vLLM's worker (LLM.apply_model): how many Mamba-2 or GDN layers are ReplaySSM's."""
    return sum(type(m).__name__ in REPLAY_LAYER_CLASSES for m in model.modules())


def machine_facts() -> dict[str, Any]:
    import torch
    import vllm

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    uuid = getattr(torch.cuda.get_device_properties(0), "uuid", None) if torch.cuda.is_available() else None
    return {
        "gpu": gpu, "cpu_cores": os.cpu_count(), "host": platform.node(), "python": platform.python_version(),
        "vllm": vllm.__version__, "torch": torch.__version__, "date": dt.date.today().isoformat(),
        "gpu_uuid": None if uuid is None else str(uuid),  # tells the lent hosts apart: each one's name is "vm"
        "cpu_model": cpu_model(),
    }  # fmt: skip


def cpu_model() -> str:
    """The host CPU's model name (/proc/cpuinfo, else ``platform.processor()``): lent hosts of one GPU kind may
    differ in CPU, and a step near the host floor follows it (session 23: one host's ReplaySSM rows ran 17-66 %
    slower than another's, native spec's did not)."""
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]  # fmt: skip
    except OSError:
        names = []
    return names[0] if names else platform.processor() or "unknown"


def open_llm(args: argparse.Namespace, **extra: Any) -> Any:
    """`vllm.LLM` for the run; the plugin is made visible first (its entry point must load in every process)."""
    from replayssm_patch.plugin_site import expose_plugin

    expose_plugin()
    # LLM.apply_model sends a function to the worker process; allowed here, on our own local pipe only.
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    from vllm import LLM

    return LLM(**llm_kwargs(args), **extra)


def replay_layers(llm: Any) -> int | str:
    try:
        return sum(llm.apply_model(count_replay_layers))
    except Exception as exc:  # a check, not the measurement: say why it could not run
        return f"not checked: {type(exc).__name__}: {exc}"[:200]


def preemptions(llm: Any) -> int | None:
    """vLLM's preemption counter so far (None if unreadable)."""
    try:
        return int(sum(m.value for m in llm.get_metrics() if m.name.startswith("vllm:num_preemptions")))
    except Exception:
        return None


def timed_generate(llm: Any, prompts: list[list[int]], tokens: int) -> Generated:
    """One timed `generate` of `tokens` tokens per prompt, with what vLLM's engine stats say about it."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    inputs = [TokensPrompt(prompt_token_ids=ids) for ids in prompts]
    params = SamplingParams(**sampling_kwargs(tokens))
    began = time.perf_counter()
    outputs = llm.generate(inputs, params, use_tqdm=False)
    elapsed = time.perf_counter() - began
    stats = [o.metrics for o in outputs]
    return Generated(
        seconds=elapsed,
        exact=all(len(o.outputs[0].token_ids) == tokens for o in outputs),
        tpots_s=[t for t in map(engine_tpot_s, stats) if t is not None],
        together=batch_ran_together(stats),
    )


def stepped_generate(llm: Any, prompts: list[list[int]], tokens: int) -> Generated:
    """``timed_generate`` stepping vLLM's engine itself (what ``LLM.generate`` does inside), with every request's
    new tokens returned per step (DELTA), so the engine core's timestamp of each step is seen: the decode window.

    Only with the engine core in its own process (vLLM's default): the extra per-step outputs are built in this
    one, off the engine's clock. host_profile.py, which runs the core in-process, keeps ``timed_generate``.
    """
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    params = delta_params(tokens)
    counts: dict[str, int] = {}
    stats: dict[str, Any] = {}
    seen: set[str] = set()
    steps = []
    began = time.perf_counter()
    for ids in prompts:
        engine.add_request(f"step-{next(_request_ids)}", TokensPrompt(prompt_token_ids=ids), params)
    while engine.has_unfinished_requests():
        outputs = engine.step()
        if not outputs:
            continue
        steps.append(observed_step(outputs, seen))
        for o in outputs:
            counts[o.request_id] = counts.get(o.request_id, 0) + len(o.outputs[0].token_ids)
            stats[o.request_id] = o.metrics
    elapsed = time.perf_counter() - began
    final = list(stats.values())
    return Generated(
        seconds=elapsed,
        exact=len(counts) == len(prompts) and all(n == tokens for n in counts.values()),
        tpots_s=[t for t in map(engine_tpot_s, final) if t is not None],
        together=batch_ran_together(final),
        window=decode_window(steps, len(prompts)),
    )


def delta_params(tokens: int) -> Any:
    """SamplingParams of exactly ``tokens`` greedy tokens, each step's new ones returned (DELTA): the stepped
    generates read every step's engine timestamp from them."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(**sampling_kwargs(tokens), output_kind=RequestOutputKind.DELTA)


_request_ids = itertools.count()  # stepped_generate's ids: unique in the process, as LLM's own counter keeps them


def repeated_generates(
    llm: Any, args: argparse.Namespace, batch: int, vocab_size: int, generate: Callable[[Any, list[list[int]], int], G]
) -> Iterator[dict[int, G]]:
    """The method's generates at one batch: a warm-up, then per repeat the short and the long generate (in
    repeat_order, each of fresh prompts) as {tokens: what `generate` returned}, yielded as each repeat ends."""
    rng = np.random.default_rng([args.seed, batch])
    timed_generate(llm, prompt_token_ids(rng, batch, args.prompt_tokens, vocab_size), SHORT_TOKENS)  # warm-up
    for r in range(args.repeats):
        yield {
            t: generate(llm, prompt_token_ids(rng, batch, args.prompt_tokens, vocab_size), t) for t in repeat_order(r)
        }


def within_budget(items: Sequence[T], budget_s: float | None, began: float, label: str = "B={}") -> Iterator[T]:
    """`items` in turn while --budget-s (seconds since `began`) is not spent; the first one skipped is named."""
    for item in items:
        if budget_s is not None and time.monotonic() - began > budget_s:
            print(f"skipped {label.format(item)} and later: --budget-s {budget_s:g} spent", flush=True)
            return
        yield item


def measure_batch(llm: Any, args: argparse.Namespace, batch: int, vocab_size: int) -> dict[str, Any]:
    before = preemptions(llm)
    repeats, runs = [], []
    for r, generated in enumerate(repeated_generates(llm, args, batch, vocab_size, stepped_generate)):
        runs += generated.items()
        short, long = generated[SHORT_TOKENS].seconds, generated[LONG_TOKENS].seconds
        window = generated[LONG_TOKENS].window
        repeats.append(Repeat(short, long, step_ms(short, long), window))
        seen = "no window" if window is None else f"window {window.mean_ms:.3f} ms over {window.steps} steps"
        print(f"  B={batch} repeat {r}: step {repeats[-1].step_ms:.3f} ms, {seen}", flush=True)
    after = preemptions(llm)
    lost = after - before if before is not None and after is not None else None
    return make_row(args, batch, repeats, **run_checks(runs, lost))


def start_engine(args: argparse.Namespace, name: str | None = None, **extra: Any) -> tuple[Any, dict[str, Any]] | None:
    """The engine and the facts every row carries; None (after one error line) if its layers are wrong."""
    began = time.monotonic()
    llm = open_llm(args, **extra)
    facts = machine_facts()
    layers = replay_layers(llm)
    facts |= {"startup_s": round(time.monotonic() - began, 1), "replayssm_layers": layers,
              "launch_shapes": launch_shapes_of(args.variant, facts["gpu"]),
              "profiler_configured": "profiler_config" in extra, "max_concurrency": max_concurrency(llm)}  # fmt: skip
    shown = name or f"{args.variant} {args.mode}"
    print(f"{shown}: engine up in {facts['startup_s']} s, ReplaySSM layers: {layers}", flush=True)
    wrong = layers_problem(args.variant, layers)
    if wrong:
        print(f"error: {wrong}")
        return None
    return llm, facts


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    few = f"--repeats must be at least 1 (got {args.repeats})" if args.repeats < 1 else None
    problem = engine_problem(args) or few or out_problem(args.out, WHAT, args.prompt_tokens)
    if problem:
        print(f"error: {problem}")
        return 2
    began = time.monotonic()
    started = start_engine(args)
    if started is None:
        return 1
    llm, facts = started
    command = command_line("replayssm_patch.gpu.engine_step", argv)
    invalid = measure_rows(llm, args, engine_batches(llm, args), args.out, command, facts, began, args.budget_s)
    return 1 if invalid else 0  # invalid rows are kept (with their problems), but the run says it failed


def measure_rows(
    llm: Any, args: argparse.Namespace, batches: Sequence[int], out: Path, command: str, facts: dict[str, Any],
    began: float, budget_s: float | None = None,
) -> int:  # fmt: skip
    """Measure, record into ``out`` and print a row per batch while --budget-s lasts; how many are invalid."""
    vocab_size = llm.llm_engine.model_config.get_vocab_size()
    invalid = 0
    for batch in within_budget(batches, budget_s, began):
        sampled = telemetry_path(out, f"{args.variant}-{args.mode}", batch)
        with sampling(sampled):
            row = measure_batch(llm, args, batch, vocab_size)
        row |= {k: facts[k] for k in ROW_FACTS} | {"conditions": sampled_conditions(sampled)}
        record_row(out, row, WHAT, command, facts)
        print(row_line(row), flush=True)
        invalid += not row["valid"]
    return invalid


if __name__ == "__main__":
    sys.exit(main())
