"""The Mamba-2 kernel bench's shared setup: shapes, vLLM's baseline call, paged caches and the traffic model.

Both ``kernel_bench`` (equivalence and decode timing) and ``verify_bench`` (speculative verify timing) build
their problems from these, so the two sections measure the same layer on the same cache layout.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from replayssm_patch.gpu.bench_common import (
    BenchPlan,
    VllmBaseline,
    paged_tensors,
    ranked_shapes,
    time_shapes,
)

if TYPE_CHECKING:  # torch and the kernels are imported lazily: TRITON_INTERPRET must be decided first
    import torch

    from replayssm_patch.kernels import ReplayCache
    from replayssm_patch.kernels.synthetic import LayerParams, StepInputs

CONV_WIDTH = 4  # Nemotron-H's conv kernel: vLLM keeps its last 3 inputs per channel
PAD = -1


@dataclass(frozen=True)
class Plan(BenchPlan):
    """The Nemotron-H-8B layer's shapes and the replay step's launch shapes swept, beside the common effort."""

    nheads: int = 128
    head_dim: int = 64
    d_state: int = 128
    ngroups: int = 8
    # (block_p, block_n, num_warps) of the replay step: 1-2-warp programs as vLLM's SSU uses, a few wider ones
    step_configs: tuple[Shape, ...] = (
        (4, 128, 1), (8, 64, 1), (8, 128, 1), (16, 32, 1), (16, 64, 1), (16, 128, 1), (16, 64, 2), (32, 64, 2),
        (32, 128, 2), (64, 64, 4),
    )  # fmt: skip
    # (block_p, block_n, num_warps) of the speculative verify's output launch: the best of sessions 19-21 (wider
    # tiles, more warps, a tensor-core form and a sum over d_state deferred to the last tile all slower); then the
    # best with registers capped (session 22: at 65 % of HBM with 4 tokens a row and 97 % with one, the launch waits
    # on its per-token sums, and more resident programs hide more; ptxas: 93 registers at 32 x 32, 80 without spills),
    # and the sums as tensor-core products
    verify_configs: tuple[Shape, ...] = (
        (32, 32, 1), (16, 128, 1), (32, 64, 1), (16, 64, 1), (16, 32, 1), (8, 128, 1),
        (32, 32, 1, 80), (32, 32, 1, 72), (32, 32, 1, 64), (16, 64, 1, 80), (16, 128, 1, 80),
        # the checkpoint reads on the tensor cores, d_state tiles pipelined 2-3 deep (wgmma at 64 rows, 4 warps)
        (64, 32, 4, 0, 3), (64, 32, 4, 0, 2), (64, 64, 4, 0, 3), (32, 32, 1, 0, 3), (32, 64, 2, 0, 3),
        # around session 23's winner, 32 x 32 x 1 warp, 3 stages (ptxas: 128 registers, 16 programs per SM): fewer
        # registers (16 x 32: 94; 2 warps: 72; capped at 112 without spills), every d_state tile in flight, 16-wide
        # tiles, and a whole head per 2-warp program (C's tiles loaded once per head, not per 32 rows; 128 and 124)
        (16, 32, 1, 0, 3), (32, 32, 2, 0, 3), (32, 32, 1, 112, 3), (32, 32, 1, 0, 4), (32, 16, 1, 0, 3),
        (64, 32, 2, 0, 3), (64, 16, 2, 0, 3),
        # and the ring's product on the tensor cores too (ptxas at 32 x 32 x 1: 138 registers, no spills; 16 x 32: 104)
        (32, 32, 1, 0, 3, 1), (32, 32, 1, 0, 2, 1), (16, 32, 1, 0, 3, 1),
        # session 24's static count (kernels/sass_mix.py): the ring's product on the tensor cores capped as the winner
        # is, at 112 registers (fp32 no spills, 9 % fewer instructions at T = 4; split 8 bytes spilled) and 128; the
        # winner's form at 96 (split: no spills, 21 programs per SM instead of 18; fp32 spills 12 bytes)
        (32, 32, 1, 112, 3, 1), (32, 32, 1, 128, 3, 1), (32, 32, 1, 96, 3),
        # the committed form as a programmatic dependent launch of the coefficient launch (session 25): its checkpoint
        # reads take the model's C and overlap that launch's end (batch 128: 14.5 µs at 24 % of HBM, a latency chain;
        # ptxas, fp32 / split: 148 / 168 registers uncapped, at 112 28 / 12 bytes spilled, at 128 126 / 128 registers
        # with 0 / 36)
        (32, 32, 1, 112, 3, 0, 1), (32, 32, 1, 128, 3, 0, 1),
        # for the split copy's reads, which session 27's winner (32 x 64 x 1, 139 registers: 14 programs per SM of 8 KB
        # each) runs at ~55 % of HBM: more bytes a program or more programs an SM without spills (ptxas, split / fp32:
        # 64 x 64 x 2 warps 128 / 168 registers, 32 x 64 x 2 80 / 96, 64 x 32 x 1 151 / 223)
        (64, 64, 2), (32, 64, 2), (64, 32, 1),
        # programs that walk 4 heads of a group in one pipelined loop over their d_state tiles (session 29), so the next
        # head's tiles load while this head's outputs form; ptxas gives the loop ~240-250 registers (its outputs'
        # address arithmetic stays live across it), so wide tiles keep bytes in flight: 64 x 64 x 2 warps 250 / 238
        # (fp32 / split, 4 programs an SM), 64 x 32 x 2 247 / 237, 32 x 64 x 1 252 / 245, no spills
        (64, 64, 2, 0, 3, 0, 0, 4), (64, 32, 2, 0, 3, 0, 0, 4), (32, 64, 1, 0, 3, 0, 0, 4),
        # the checkpoint's tiles copied by the tensor memory accelerator (session 29): no per-element addresses in
        # registers (ptxas, fp32 / split: 32 x 32 x 1 warp 112 / 110 against 128 / 146 without; with the ring's product
        # there too 126 / 128; 64 x 32 x 2 96 / 116; 64 x 64 x 4 120 / 79; 32 x 128 x 2 warps at 2 stages 194 / 72; 4
        # heads a program at 64 x 64 x 2 223 / 225), no spills
        (32, 32, 1, 0, 3, 0, 0, 1, 1), (32, 32, 1, 0, 3, 1, 0, 1, 1), (64, 32, 2, 0, 3, 0, 0, 1, 1),
        (64, 64, 4, 0, 3, 0, 0, 1, 1), (32, 128, 2, 0, 2, 0, 0, 1, 1), (64, 64, 2, 0, 3, 0, 0, 4, 1),
    )  # fmt: skip
    # (heads per program, num_warps) of the verify's coefficient launch, swept alone before the whole verify: its 4 x
    # 4 ran at 27 % of HBM (session 27). ptxas: 168 registers at 4 x 4 (3 programs, 12 warps an SM); 8 warps spread
    # the group's B tile, 111-114 registers at 4-16 heads (2 programs, 16 warps); 16 x 4 197, 8 x 4 193; 2 warps spill
    verify_coef_configs: tuple[Shape, ...] = ((4, 4), (4, 8), (8, 8), (16, 8), (8, 4), (16, 4))
    # shapes (``FOLD_KNOBS``) of the flush launch that folds before a verify (``flush.flush_ring``): its
    # default 16 x 4, wider tiles and more warps, with and without the next block's loads before the stores (ptxas
    # at the verify ring's 32-entry tile, walking the plan's list: 16 x 4 with the prefetch spills 64 bytes, 32 x 4
    # with it 488: left out)
    fold_configs: tuple[Shape, ...] = (
        (16, 4, 0), (16, 4, 1), (32, 4, 0), (16, 8, 0), (16, 8, 1), (32, 8, 0), (32, 8, 1), (64, 8, 0),
        # session 22's cap for three 4-warp programs per SM (tf32x3 took 189 registers at the verify ring's 32 entries;
        # the two-pass dot of session 25 takes 159 uncapped, and 224 with the prefetch, no longer spilling)
        (16, 4, 0, 168),
        # the listed grid sized to what an SM holds (session 25, the two-pass dot at the ring's 32 entries): four
        # in-order programs capped at 128 registers (ptxas: 76 bytes spilled), two of the prefetch form (224-247
        # registers, which leave room for two, so a third program per SM waited for a slot)
        (16, 4, 0, 128, 4), (16, 4, 1, 0, 2),
        # work items of a d_state slice (session 29): a narrower master tile and ring B, so 1-2-warp programs fit
        # without spills and an SM holds more of them (ptxas at the ring's 32 entries, fp32 / split copy: 16 x 64 x 2
        # warps 145 / 197 registers, 32 x 32 x 2 167 / 167, 16 x 32 x 1 168 / 208, 16 x 64 x 4 91 / 128, with the
        # prefetch 16 x 32 x 2 151 / 156 and 16 x 64 x 4 148 / 154; whole d_state rows on 1-2 warps spilled 28-2,308
        # bytes), the listed grid sized to what the registers let an SM hold
        (16, 2, 0, 0, 6, 64), (32, 2, 0, 0, 6, 32), (16, 1, 0, 0, 9, 32), (16, 4, 0, 0, 4, 64), (16, 2, 1, 0, 6, 32),
        (16, 4, 1, 0, 3, 64),
    )  # fmt: skip
    # a second ring the verify section times at its two largest batches: at T = 4, L = 28 fills the 32-entry tile the
    # kernels already pad L + T = 20 to, and a row folds every ceil(28 / AL) verifies instead of every ceil(16 / AL)
    verify_long_ring: int = 28
    # T of the verify's rows at the largest batch besides k = 3's 4 (the ring L + T): how much of the output launch
    # the T-token products take beside the checkpoint read they share (k = 0, 1 and 7)
    verify_token_sweep: tuple[int, ...] = (1, 2, 8)
    # the verify step of this many layers in turn, each on a pool of its own this many slots (Nemotron-H-8B's 24 Mamba
    # layers; the ring of 28's engine capacity, 622 requests): the engine's footprint, ~70 GB at the ring of 28
    rotation_layers: int = 24
    rotation_pool: int = 640


SMOKE_PLAN = Plan(
    nheads=4, head_dim=8, d_state=16, ngroups=2, buffer_len=4, eq_batch=3, eq_steps=6, batches=(2,),
    warmup=1, graph_calls=1, repeats=1, step_configs=((16, 64, 1), (8, 16, 2)),
    verify_configs=((16, 64, 1), (8, 16, 2, 80, 2), (8, 16, 1, 0, 2, 1), (8, 16, 1, 0, 2, 0, 1),
                    (8, 16, 1, 0, 2, 0, 0, 2), (16, 16, 1, 0, 2, 0, 0, 1, 1)),
    verify_coef_configs=((4, 4), (2, 2)),
    fold_configs=((16, 4, 0), (16, 4, 1, 168), (16, 4, 0, 0, 2), (16, 2, 1, 0, 6, 16)), verify_long_ring=5,
    verify_token_sweep=(2,), rotation_layers=2, rotation_pool=9,
)  # fmt: skip


@dataclass(frozen=True)
class Baseline(VllmBaseline):
    """vLLM's selective_state_update if importable, else None (the fp64 reference stands in for equivalence)."""

    SOURCE = ("vllm.model_executor.layers.mamba.ops.mamba_ssm", "selective_state_update", "selective_state_update")

    def step(
        self, state: torch.Tensor, inputs: StepInputs, layer: LayerParams, indices: torch.Tensor, out: torch.Tensor
    ) -> None:
        """One baseline decode step, called the way vLLM's MambaMixer2 calls it (head_dim-expanded A/dt/D)."""
        self.call(state, inputs, layer, out, state_batch_indices=indices)

    def call(
        self, state: torch.Tensor, inputs: StepInputs, layer: LayerParams, out: torch.Tensor, **indexing: Any
    ) -> None:
        """One call of ``fn`` on ``inputs``, A/dt/D expanded over head_dim, ``indexing`` naming the state rows."""
        assert self.fn is not None
        P, N = inputs.x.shape[2], inputs.B.shape[2]
        kwargs = {
            "D": layer.D[:, None].expand(-1, P),
            "z": None,
            "dt_bias": layer.dt_bias[:, None].expand(-1, P),
            "dt_softplus": True,
            "pad_slot_id": PAD,  # older vLLM
            "null_block_id": PAD,  # vLLM 0.24: rows whose index equals it are skipped (its default, 0, is a real row)
            "out": out,
            **indexing,
        }
        params = inspect.signature(self.fn).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            kwargs = {k: v for k, v in kwargs.items() if k in params}  # tolerate renamed / dropped options
        dt = inputs.dt[:, :, None].expand(-1, -1, P)
        A = layer.A[:, None, None].expand(-1, P, N)
        self.fn(state, inputs.x, dt, A, inputs.B, inputs.C, **kwargs)

    def probe(self, plan: Plan, device: str) -> tuple[Callable[[], Any], Callable[[], float]]:
        """A 2-row step from zero states; rows it skips stay NaN, which fails the check too."""
        import torch

        from replayssm_patch.gpu.layer_check import relative_error
        from replayssm_patch.kernels.ground_truth import recurrence_step_fp64

        layer, inputs = probe_inputs(plan, device, 2)
        state = torch.zeros(2, plan.nheads, plan.head_dim, plan.d_state, device=device)
        out = torch.full_like(inputs.x, float("nan"))

        def error() -> float:
            expected = recurrence_step_fp64(
                torch.zeros_like(state, dtype=torch.float64), inputs.x, inputs.dt, layer.A, inputs.B, inputs.C,
                D=layer.D, dt_bias=layer.dt_bias,
            )  # fmt: skip
            return relative_error(out, expected)

        rows = torch.arange(2, dtype=torch.int32, device=device)
        return lambda: self.step(state, inputs, layer, rows, out), error


# (block_p, block_n, num_warps[, maxnreg[, mma_stages[, mma_ring[, pdl[, heads[, tma]]]]]]) of a replay or verify
# launch, (block_p, num_warps, prefetch[, maxnreg[, programs_per_sm[, block_n]]]) of the fold: maxnreg caps the
# registers per thread (0: none), programs_per_sm sizes the fold's listed grid, the fold's block_n cuts its items into
# d_state slices, mma_stages puts the verify's checkpoint reads on the tensor cores, mma_ring its ring's product too,
# pdl makes it a programmatic dependent launch of the coefficient launch, heads the heads each program walks and tma
# copies the checkpoint's tiles by the tensor memory accelerator (kernels.launch_config)
Shape = tuple[int, ...]


def sweep_shapes(
    label: str, call_of: Callable[[str, Shape], Callable[[], Any]], plan: Plan, device: str,
    configs: Sequence[Shape] | None = None,
) -> dict:  # fmt: skip
    """The fastest of ``configs`` (default ``plan.step_configs``) per checkpoint mode for one kernel (``label``: what
    is timed, e.g. the decode step or the verify), with every shape's µs."""
    found: dict[str, Any] = {}
    for mode in ("fp32", "split"):
        calls = {"x".join(map(str, cfg)): call_of(mode, cfg) for cfg in configs or plan.step_configs}
        timings = time_shapes("kernel_bench", f"{label} {mode}", calls, plan, device)
        best = min(timings, key=timings.__getitem__)
        found[mode] = {"us": timings, "best": tuple(int(v) for v in best.split("x"))}
        print(f"[kernel_bench]   sweep {label} {mode}: best {best} ({timings[best]:.1f} us)", flush=True)
    return found


def sweep_markdown(sweep: dict[str, Any], what: str, shape: str = "block_p x block_n x warps") -> list[str]:
    """One line per mode of a ``sweep_shapes`` result (``shape``: what the parts of a shape's name are)."""
    lines = []
    for mode, found in sweep.items():
        lines += [f"Sweep, {what} {mode} ({shape}: us): {ranked_shapes(found['us'])}.", ""]
    return lines


# the verify's last six only where a shape names them
REPLAY_KNOBS = (
    "block_p", "block_n", "num_warps", "maxnreg", "mma_stages", "mma_ring", "pdl", "heads_per_program", "tma",
)  # fmt: skip
FOLD_KNOBS = ("block_p", "num_warps", "prefetch", "maxnreg", "programs_per_sm", "block_n")
COEF_KNOBS = ("coef_head_chunk", "coef_num_warps")  # a swept shape of the verify's coefficient launch


def tuning_of(cfg: Shape | None) -> dict[str, int]:
    """A swept shape as the kernels' keyword knobs, named in ``REPLAY_KNOBS`` order (none: the launch table's)."""
    return {} if cfg is None else dict(zip(REPLAY_KNOBS, cfg, strict=False))


def coef_tuning_of(cfg: Shape | None) -> dict[str, int]:
    """A swept shape of the verify's coefficient launch as ``replay_verify``'s knobs (none: the table's)."""
    return {} if cfg is None else dict(zip(COEF_KNOBS, cfg, strict=True))


def fold_tuning_of(cfg: Shape | None) -> dict[str, int | bool]:
    """A swept shape of the flush launch as ``flush_ring``'s knobs, in ``FOLD_KNOBS`` order (none: the table's)."""
    return {} if cfg is None else {**dict(zip(FOLD_KNOBS, cfg, strict=False)), "prefetch": bool(cfg[2])}


def probe_inputs(plan: Plan, device: str, tokens: int) -> tuple[LayerParams, StepInputs]:
    """A random layer and ``tokens`` rows of inputs for a baseline probe, seeded alike for every probe."""
    import torch

    from replayssm_patch.kernels.synthetic import LayerParams, StepInputs

    gen = torch.Generator(device).manual_seed(0)
    layer = LayerParams.random(plan.nheads, gen, device)
    inputs = StepInputs.random(
        tokens, plan.nheads, plan.head_dim, plan.ngroups, plan.d_state, layer, gen, torch.bfloat16
    )
    return layer, inputs


def scattered_slots(pool: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """``count`` distinct int32 slots drawn from 1..pool-1 (a server's live slots are never 0..B-1)."""
    import torch

    return (torch.randperm(pool - 1, generator=gen, device=gen.device)[:count] + 1).to(torch.int32)


def filled_caches(
    plan: Plan,
    pool: int,
    indices: torch.Tensor,
    gen: torch.Generator,
    spec_tokens: int = 0,
    modes: tuple[str, ...] = ("fp32", "split"),
) -> dict[str, ReplayCache]:
    """Paged caches of ``pool`` slots per mode ("fp32", "split": with the bf16 copy), random checkpoints in
    ``indices`` and random rings (dt as softplus(U[-5, 0]), as the synthetic layers draw it)."""
    import torch

    from replayssm_patch.kernels.common import softplus_reference

    caches = {}
    for mode in modes:
        split = mode == "split"
        cache = paged_cache(plan, pool, split, str(gen.device), spec_tokens)
        shape = (indices.shape[0], plan.nheads, plan.head_dim, plan.d_state)
        cache.set_checkpoint(indices, torch.randn(shape, generator=gen, device=gen.device))
        cache.ring_x.normal_(generator=gen)
        cache.ring_B.normal_(generator=gen)
        cache.ring_dt.copy_(
            softplus_reference(torch.rand(cache.ring_dt.shape, generator=gen, device=gen.device) * 5 - 5)
        )
        caches[mode] = cache
    return caches


def flush_call(
    cache: ReplayCache, A: torch.Tensor, indices: torch.Tensor, lengths: torch.Tensor, cfg: Shape | None = None,
    work_list: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Callable[[], Any]:  # fmt: skip
    """The standalone flush launch over every row, folding the first ``lengths`` ring entries of each (``cfg``: a
    swept shape (``FOLD_KNOBS``), else the launch table's; ``work_list``: the folding rows, as a plan lists
    them)."""
    from replayssm_patch.kernels import flush_ring

    return lambda: flush_ring(
        cache.ssm_state, cache.ring_x, cache.ring_B, cache.ring_dt, A, indices, lengths, state_bf16=cache.state_bf16,
        work_list=work_list, **fold_tuning_of(cfg),
    )  # fmt: skip


def stock_shapes(plan: Plan, spec_tokens: int = 0) -> tuple[tuple[int, ...], ...]:
    """vLLM's own (conv, ssm) state shapes of a Mamba-2 layer, the conv window widened by k under speculation."""
    conv_dim = plan.nheads * plan.head_dim + 2 * plan.ngroups * plan.d_state
    return (conv_dim, CONV_WIDTH - 1 + spec_tokens), (plan.nheads, plan.head_dim, plan.d_state)


def paged_cache(plan: Plan, slots: int, split: bool, device: str, spec_tokens: int = 0) -> ReplayCache:
    """A ReplayCache whose tensors are views into one page per slot, laid out by the plugin's own MambaSpec
    functions (conv state, checkpoint, ring, bf16 copy), as vLLM packs them; with ``spec_tokens`` = k the
    speculative layout (rings of buffer_len + 1 + k entries, conv widened)."""
    import torch

    from replayssm_patch.config import ReplaySSMConfig
    from replayssm_patch.kernels import ReplayCache
    from replayssm_patch.state_layout import (
        RING_B,
        RING_DT,
        RING_X,
        STATE_BF16,
        replay_state_dtypes,
        replay_state_shapes,
    )

    knobs = ReplaySSMConfig(enable=True, buffer_len=plan.buffer_len, split_precision=split)
    verify_len = 1 + spec_tokens if spec_tokens else 0
    shapes = replay_state_shapes(stock_shapes(plan, spec_tokens), knobs, dim_first=True, verify_len=verify_len)
    dtypes = replay_state_dtypes((torch.bfloat16, torch.float32), torch.bfloat16, knobs)
    tensors = paged_tensors(shapes, dtypes, slots, device)
    copy = tensors[STATE_BF16] if split else None
    return ReplayCache(tensors[1], tensors[RING_X], tensors[RING_B], tensors[RING_DT], copy)


@dataclass(frozen=True)
class TrafficModel:
    """Bytes each kernel must move from/to HBM (bf16 activations and ring, fp32 ring dt; the verify's coefficient
    scratch, ~3% of a row's fp32 state, is left out)."""

    plan: Plan
    batch: int

    @property
    def _state_elems(self) -> int:
        return self.batch * self.plan.nheads * self.plan.head_dim * self.plan.d_state

    @property
    def _entry_bytes(self) -> int:  # one ring entry of one sequence: x, B (per group) and dt
        p = self.plan
        return p.nheads * p.head_dim * 2 + p.ngroups * p.d_state * 2 + p.nheads * 4

    @property
    def _io_bytes(self) -> int:  # x in, y out, B and C in, dt in
        p = self.plan
        return self.batch * (2 * p.nheads * p.head_dim * 2 + 2 * p.ngroups * p.d_state * 2 + p.nheads * 4)

    def baseline(self, state_bytes: int, tokens: int = 1) -> float:
        """vLLM's update of ``tokens`` tokens per row: the state read once and written after every token (the
        speculative path keeps one state block per query token)."""
        return tokens * self._io_bytes + (1 + tokens) * self._state_elems * state_bytes

    def replay(self, state_bytes: int) -> float:
        return self.verify(state_bytes, 1, (self.plan.buffer_len - 1) / 2)  # staggered cursors: (L-1)/2 earlier

    def verify(self, state_bytes: int, tokens: int, history: float) -> float:
        """``tokens`` outputs per row from one checkpoint read: ``history`` ring entries read (a mean over rows),
        the tokens' entries appended."""
        ring = self.batch * (history + tokens) * self._entry_bytes
        return tokens * self._io_bytes + self._state_elems * state_bytes + ring

    def verify_coefficients(self, tokens: int, history: float, ring_len: int) -> float:
        """The verify's coefficient launch: B and C in, the rows' B and dt entries read and appended, and its
        scratch (bc per group, weights per head, over the kernel's [T, L] blocks) written."""
        from replayssm_patch.kernels.common import block_size  # lazily, as every kernel import here

        p, tiles = self.plan, block_size(tokens) * block_size(ring_len, floor=16)
        entries = self.batch * (history + tokens) * (p.ngroups * p.d_state * 2 + p.nheads * 4)
        scratch = self.batch * (p.ngroups + p.nheads) * tiles * 4
        return self.batch * tokens * 2 * p.ngroups * p.d_state * 2 + entries + scratch

    def flush(self, share: float, copy_bytes: int, entries: float | None = None) -> float:
        """``share`` of the rows folding ``entries`` ring entries each (default the whole decode ring)."""
        ring = self.batch * (self.plan.buffer_len if entries is None else entries) * self._entry_bytes
        return share * (ring + self._state_elems * (4 + 4 + copy_bytes))

    def fold(self, share: float, read_bytes: int, copy_bytes: int) -> float:
        """What flushing rows add to a replay: master read (if the replay read the bf16 copy) and write, the copy,
        their B entries (the x entries are read by the replay anyway)."""
        p = self.plan
        extra_read = 4 - read_bytes
        ring_B = self.batch * p.buffer_len * p.ngroups * p.d_state * 2
        return share * (self._state_elems * (extra_read + 4 + copy_bytes) + ring_B)

    def aligned(self, copy_bytes: int) -> float:
        """Every row at write_pos L-1, all flushing: full rings read, master read and written (+ the copy)."""
        return (
            self._io_bytes
            + self.batch * self.plan.buffer_len * self._entry_bytes
            + self._state_elems * (4 + 4 + copy_bytes)
        )
