"""Launch shapes of the decode kernels: the defaults, or a GPU's measured best.

The Mamba-2 kernel bench sweeps the replay step's (block_p, block_n, num_warps) on the GPU and writes the fastest
per checkpoint dtype to a JSON file (``"replay_step"``), the speculative verify's (``"verify_step"``, the
``VerifyLaunch`` fields; without it the verify runs the replay step's shapes) and the flush launch's that folds before
it (``"fold"``, the ``FoldLaunch`` fields); the GDN bench does the same for the GDN replay and fold launches
(``"gdn"``). ``REPLAYSSM_LAUNCH_CONFIG=<file>`` makes the plugin use such a file (as vLLM reads its tuned
kernel configs), and a GPU model's committed file beside this module is used on that GPU without it: the H200's
(``launch_h200.json``: every kernel) and the H100's (``launch_h100.json``: the decode step and its native limits,
session 31's only sweep that completed there). An entry the file lacks keeps its defaults.

``"native_max_batch"`` and ``"gdn_native_max_batch"`` (``{"fp32": N, "split": M}``, per checkpoint): the largest
decode batch up to which the Mamba-2 / GDN bench measured vLLM's one fused kernel faster than the ring's decode step
(three launches per layer); at those batches the builders run vLLM's own decode path on the fp32 checkpoint (the
native regime, ``backend.plan_ring``). Split precision has its own entry: its replay reads half the checkpoint
bytes, so vLLM's kernel stops winning at a smaller batch. Default 0: never.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

ENV_VAR = "REPLAYSSM_LAUNCH_CONFIG"
COMMITTED = {model: Path(__file__).with_name(f"launch_{model.lower()}.json") for model in ("H200", "H100")}


@dataclass(frozen=True)
class ReplayLaunch:
    """Head_dim rows and d_state columns per tile and warps of the replay step's and the verify's output launch, and
    (``maxnreg``, 0: ptxas decides) a cap on registers per thread: a 1-warp program's registers decide how many an
    SM holds (ptxas, the verify at 32 x 32: 93 registers, 21 programs; capped at 80, no spills, 25)."""

    block_p: int = 16
    block_n: int = 64
    num_warps: int = 1
    maxnreg: int = 0

    def as_key(self) -> str:
        return f"{self.block_p}x{self.block_n}x{self.num_warps}w" + (f" <={self.maxnreg} regs" if self.maxnreg else "")


DEFAULT = ReplayLaunch()


@dataclass(frozen=True)
class VerifyLaunch(ReplayLaunch):
    """The replay step's knobs for the speculative verify's output launch, and ``mma_stages``: 0 sums its checkpoint
    reads on the CUDA cores; n > 0 forms them on the tensor cores (checkpoint x C^T in tf32, two passes on the fp32
    checkpoint, one on the split copy, the tokens padded to 16; ``state_products.checkpoint_reads_mma``) over d_state
    tiles that Triton pipelines through shared memory in n stages. Why: at 4 tokens a row the CUDA-core sums held the
    launch at 65 % of HBM, against 97 % at one (session 22). ptxas at 64 x 32 x 4 warps (wgmma), 3 stages, fp32
    checkpoint and bf16 C: 94 registers, no spills, 1,312 instructions per warp for 32 KB of checkpoint, ~1.25x the
    CUDA-core form's per KB, so it can only win where that form waits on latency rather than issue (it issues ~1.3
    instructions per cycle per SM at batch 256: 2,112 per 16 KB program, 415 µs). Session 23 (H200, batch 256): 32 x 32
    x 1 warp, 3 stages, 505.2 against 548.0 µs for the verify step; the engine on that host could not tell."""

    mma_stages: int = 0
    mma_ring: int = 0  # 1: the ring's T x (m + T) product on the tensor cores too (needs mma_stages)
    # 1: a programmatic dependent launch of the coefficient launch (needs mma_stages; not yet timed): its checkpoint
    # reads overlap that launch's last programs, ~15 µs at batch 128 that the bench measured at 24 % of HBM
    pdl: int = 0
    # the coefficient launch's heads per program and warps (0: verify.VERIFY_HEAD_CHUNK and VERIFY_COEF_NUM_WARPS):
    # at 4 heads x 4 warps it ran at 27 % of HBM (session 27, batch 128: 14.3 µs, 0.34 ms of a spec step over 24
    # layers), its time growing with its programs (4,096 at 128), so fewer, wider ones may take less
    coef_head_chunk: int = 0
    coef_num_warps: int = 0
    # n > 1: each output program walks n heads of a group in one pipelined loop over their d_state tiles (needs
    # mma_stages): the next head's tiles load while this head's outputs form. Why: the split copy's verify ran at ~55 %
    # of HBM with a program per head, each a chain of loads then its T-token work (session 28), so fewer, longer
    # programs with the next loads in flight may keep more bytes moving. 0 or 1: a program per head.
    heads_per_program: int = 0
    # 1: the checkpoint tiles come by Hopper's tensor memory accelerator through a descriptor (needs mma_stages): no
    # address arithmetic per element in registers (ptxas: the per-element form's pipelined reads hold 128-168), so an
    # SM may hold more programs and more bytes in flight
    tma: int = 0

    def as_key(self) -> str:
        coef = (
            f" coef {self.coef_head_chunk}h{self.coef_num_warps}w"
            if self.coef_head_chunk or self.coef_num_warps
            else ""
        )
        return (super().as_key() + (f" mma {self.mma_stages} stages" if self.mma_stages else "")
                + (" ring mma" if self.mma_ring else "") + (" pdl" if self.pdl else "")
                + (f" {self.heads_per_program} heads" if self.heads_per_program > 1 else "")
                + (" tma" if self.tma else "") + coef)  # fmt: skip


@dataclass(frozen=True)
class FoldLaunch:
    """Head_dim rows per program, warps, whether each head_dim block's loads go before the previous block's stores,
    a cap on registers per thread (0: none), programs per SM and d_state columns per work item, of the flush launch
    (``flush.flush_ring``: the fold before a speculative verify and before a prefill). ptxas at the verify ring's
    32-entry tile: 184-189 registers, two 4-warp programs per SM; capped at 168, three (32-36 bytes spilled)."""

    block_p: int = 16
    num_warps: int = 4
    prefetch: bool = False
    maxnreg: int = 0
    # programs per SM of the fixed grid that walks the folding rows (0: decode_fold.PROGRAMS_PER_SM, 3): as many as
    # the registers let an SM hold, one wave, so no program waits for another's slot
    programs_per_sm: int = 0
    # d_state columns per work item (0: all): a narrower slice of the master tile and of the ring's B fits 1-2-warp
    # programs without spills (ptxas at 16 x 128: 255 registers and 28-2,308 bytes spilled), so an SM holds more of
    # them and more loads in flight; the GDN split fold's latency-bound flush fell from ~74 to ~44 µs so (session 28)
    block_n: int = 0

    def as_key(self) -> str:
        return (f"{self.block_p}x{self.num_warps}w" + (f" n{self.block_n}" if self.block_n else "")
                + (" prefetch" if self.prefetch else "")
                + (f" <={self.maxnreg} regs" if self.maxnreg else "")
                + (f" {self.programs_per_sm}/SM" if self.programs_per_sm else ""))  # fmt: skip


@dataclass(frozen=True)
class GdnLaunch:
    """Head_v_dim rows per program and warps of the GDN decode step's replay and fold launches.

    Defaults from ptxas (compile_check, head dims 128, L = 16): a [32, 128] fp32 checkpoint tile over 4 warps
    takes 72 registers in the replay, no spills ([16, 128] over 2 warps 79, over 4 warps 48; [64, 128] over 8
    warps 78; 128 or more, then spills, wherever the tile is 64 per thread). The tf32x3 fold over [16, 128] tiles
    on 4 warps takes 139 registers without spills, 3 programs per SM; [32, 128] takes 182 (2 per SM), and 8 warps
    over them 128.
    """

    replay_block_v: int = 32
    replay_num_warps: int = 4
    fold_block_v: int = 16
    fold_num_warps: int = 4
    # > 0: the replay's checkpoint products with k̂ and q̂ on the tensor cores (tf32x3), its head_k_dim tiles pipelined
    # through shared memory that deep, as the Mamba-2 verify's reads (not yet timed; ptxas: see compile_check)
    replay_mma_stages: int = 0
    # the fold's cap on registers per thread (0: none) and its listed grid's programs per SM (0: 3): the fold is
    # latency-bound (34 % of HBM with every row folding), and 3 programs of 4 warps hold 12 warps an SM (ptxas:
    # 16 x 4 warps capped at 128 registers, no spills, so 4 fit; 8 warps take 110-128, so 2 fit, not the grid's 3)
    fold_maxnreg: int = 0
    fold_programs_per_sm: int = 0
    # split precision's fold replays each item's window one entry at a time (no tensor-core product, so no block
    # floor of 16), a chain of dependent steps per item (session 27 on the H200: 74 µs of a 188.7 µs step at batch
    # 256, against the fp32 fold's 35), so it has shapes of its own: smaller programs and more of them resident, or
    # wider ones that load each key once for more rows. 0: the fold's.
    split_fold_block_v: int = 0
    split_fold_num_warps: int = 0
    split_fold_programs_per_sm: int = 0

    def split_fold(self) -> tuple[int, int, int]:
        """(block_v, num_warps, programs per SM) of split precision's fold launch."""
        return (
            self.split_fold_block_v or self.fold_block_v,
            self.split_fold_num_warps or self.fold_num_warps,
            self.split_fold_programs_per_sm or self.fold_programs_per_sm,
        )

    def as_key(self) -> str:
        replay = f"replay {self.replay_block_v}x{self.replay_num_warps}w"
        mma = f" mma {self.replay_mma_stages} stages" if self.replay_mma_stages else ""
        fold = (
            f"fold {self.fold_block_v}x{self.fold_num_warps}w"
            + (f" <={self.fold_maxnreg} regs" if self.fold_maxnreg else "")
            + (f" {self.fold_programs_per_sm}/SM" if self.fold_programs_per_sm else "")
        )
        split_block_v, split_warps, split_per_sm = self.split_fold()
        own = self.split_fold_block_v or self.split_fold_num_warps or self.split_fold_programs_per_sm
        split = f", split fold {split_block_v}x{split_warps}w" + (f" {split_per_sm}/SM" if split_per_sm else "")
        return f"{replay}{mma}, {fold}{split if own else ''}"


GDN_DEFAULT = GdnLaunch()


def _state_entry(state_dtype: torch.dtype) -> str:
    return "split" if state_dtype.itemsize <= 2 else "fp32"


@functools.cache  # every layer launch asks: read the table once per (dtype, device), not per launch
def launch_for(state_dtype: torch.dtype, device: torch.device) -> ReplayLaunch:
    """The replay step's tuned shape for a checkpoint of ``state_dtype`` ("fp32" or "split" entry), else the
    default."""
    return _launch_entry(_tuned_table(_device_name(device)), _state_entry(state_dtype), "replay_step", ReplayLaunch)


@functools.cache
def verify_launch_for(state_dtype: torch.dtype, device: torch.device) -> VerifyLaunch:
    """The speculative verify's output launch for a checkpoint of ``state_dtype``: the table's verify entry, else
    the replay step's knobs (tables from before the verify had a sweep), else the default."""
    return _launch_entry(_tuned_table(_device_name(device)), _state_entry(state_dtype), "verify_step", VerifyLaunch)


Launch = TypeVar("Launch", bound=ReplayLaunch)


def _launch_entry(table: dict[str, dict], entry: str, kernel: str, kind: type[Launch]) -> Launch:
    for name in dict.fromkeys((kernel, "replay_step")):
        if entry in table.get(name, {}):
            return kind(**table[name][entry])
    return kind()


@functools.cache
def fold_launch_for(with_copy: bool, device: torch.device) -> FoldLaunch:
    """The flush launch's tuned shape (the table's ``"fold"`` entry, ``"split"`` when it refreshes a bf16 copy, else
    ``"fp32"``), else the defaults."""
    return FoldLaunch(**_tuned_table(_device_name(device)).get("fold", {}).get("split" if with_copy else "fp32", {}))


@functools.cache
def native_max_batch(device: torch.device, split: bool = False) -> int:
    """Mamba-2 decode batches up to this size run vLLM's own decode path on the fp32 checkpoint, else 0."""
    return _native_limit(_tuned_table(_device_name(device)), "native_max_batch", split)


@functools.cache
def gdn_native_max_batch(device: torch.device, split: bool = False) -> int:
    """GDN decode batches up to this size run vLLM's own decode path on the fp32 checkpoint, else 0."""
    return _native_limit(_tuned_table(_device_name(device)), "gdn_native_max_batch", split)


def _native_limit(table: dict[str, Any], entry: str, split: bool) -> int:
    """The table's native limit ``entry`` for the checkpoint in use (``"split"`` or ``"fp32"``)."""
    return int(table.get(entry, {}).get("split" if split else "fp32", 0))


@functools.cache
def gdn_launch_for(device: torch.device) -> GdnLaunch:
    """The GDN decode step's tuned shapes on this device (the table's ``"gdn"`` entry), else the defaults."""
    return GdnLaunch(**_tuned_table(_device_name(device)).get("gdn", {}))


def launch_shapes_in_use(device_name: str) -> dict[str, str]:
    """Which replay launch shapes a process on ``device_name`` uses and where they come from, for result rows:
    a kernel figure is only comparable with the shapes it ran."""
    table = _tuned_table(device_name)
    shapes = {entry: _launch_entry(table, entry, "replay_step", ReplayLaunch).as_key() for entry in ("fp32", "split")}
    verify = ", ".join(f"{entry} {_launch_entry(table, entry, 'verify_step', VerifyLaunch).as_key()}"
                       for entry in ("fp32", "split"))  # fmt: skip
    folds = table.get("fold", {})
    fold = ", ".join(f"{entry} {FoldLaunch(**folds.get(entry, {})).as_key()}" for entry in ("fp32", "split"))
    gdn = GdnLaunch(**table.get("gdn", {})).as_key()
    native = ", ".join(
        f"{family}{checkpoint} <= {_native_limit(table, entry, checkpoint == 'split')}"
        for family, entry in (("", "native_max_batch"), ("gdn ", "gdn_native_max_batch"))
        for checkpoint in ("fp32", "split")
    )
    return {
        "source": _table_path(device_name) or "defaults", **shapes, "verify": verify, "fold": fold, "gdn": gdn,
        "native_batches": native,
    }  # fmt: skip


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _table_path(device_name: str) -> str | None:
    """REPLAYSSM_LAUNCH_CONFIG, else the committed file of this GPU model, else None (the defaults)."""
    found = [str(file) for key, file in COMMITTED.items() if key in device_name and file.exists()]
    return os.environ.get(ENV_VAR) or (found[0] if found else None)


def _tuned_table(device_name: str) -> dict[str, dict]:
    path = _table_path(device_name)
    table = json.loads(Path(path).read_text()) if path else {}
    shapes = [(f"{kernel}.{entry}", kind, knobs) for kernel, kind in (("replay_step", ReplayLaunch),
              ("verify_step", VerifyLaunch)) for entry, knobs in table.get(kernel, {}).items()]  # fmt: skip
    shapes += [(f"fold.{entry}", FoldLaunch, knobs) for entry, knobs in table.get("fold", {}).items()]
    for where, kind, knobs in [*shapes, ("gdn", GdnLaunch, table.get("gdn", {}))]:
        known = {field.name for field in dataclasses.fields(kind)}
        if unknown := sorted(set(knobs) - known):  # e.g. a table of another version of the benches
            raise ValueError(
                f"launch table {path}: {where} has unknown keys {unknown} (it may hold {sorted(known)}); delete them, "
                "or write a new table with the kernel bench"
            )
    for entry in ("native_max_batch", "gdn_native_max_batch"):  # a single N before the limits were per checkpoint
        if not isinstance(table.get(entry, {}), dict):
            raise ValueError(
                f'launch table {path}: {entry} is {table[entry]!r}, not {{"fp32": N, "split": M}} (a limit per '
                "checkpoint); write it so, or write a new table with the kernel bench"
            )
    return table
