"""The GPU benchmarks' --smoke runs on CPU as a user would start them, their launch tables and stand-ins."""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from replayssm_patch.gpu.kernel_bench import render_markdown, run_equivalence, run_timing
from replayssm_patch.gpu.mamba_bench_setup import SMOKE_PLAN, Baseline
from replayssm_patch.gpu.verify_bench import run_verify, verify_problem
from replayssm_patch.kernels.ground_truth import recurrence_step_fp64
from tests.replayssm.kernels.processes import REPO, run_module


def test_kernel_bench_smoke_runs_on_cpu(tmp_path: Path) -> None:
    done = run_module("replayssm_patch.gpu.kernel_bench", "--smoke", "--out", str(tmp_path), interpret=False)
    assert done.returncode == 0, done.stdout
    data = json.loads((tmp_path / "kernel_bench.json").read_text())
    assert "fp64 reference" in data["meta"]["baseline"], "without vLLM the fp64 fallback must be named"
    eq = data["equivalence"]
    assert eq["status"] == "ok", eq.get("traceback")
    assert eq["fp32"]["finite"] and eq["split"]["finite"]
    assert eq["fp32"]["max_rel_err"] <= 2e-5 and eq["fp32"]["final_state_rel_err"] <= 2e-5
    assert 1e-4 < eq["split"]["max_rel_err"] <= 2e-2, "split precision must show (bounded) bf16 error"
    assert eq["split"]["final_state_rel_err"] <= 2e-5, "the fp32 master must not drift in split precision"
    timing = data["timing"]
    assert timing["status"] == "ok", timing.get("traceback")
    kernels = {row["kernel"] for row in timing["rows"]}
    assert {
        "replay fp32 (no row flushing)", "replay split (no row flushing)", "decode step fp32 (1/L rows flushing)",
        "decode step split (all rows flushing)", "materialise flush fp32 (all rows)",
    } <= kernels  # fmt: skip
    assert not any("every row folds" in kernel for kernel in kernels), "the fold-all step is gone"
    assert set(timing["sweep"]) == {"fp32", "split"} and len(timing["sweep"]["fp32"]["us"]) == 2
    table = json.loads((tmp_path / "launch_config.json").read_text())
    tuned = table["replay_step"]
    assert set(tuned) == {"fp32", "split"} and set(tuned["fp32"]) == {"block_p", "block_n", "num_warps"}
    assert table["native_max_batch"] == {"fp32": 0, "split": 0}, "no vLLM baseline row here: never native"
    markdown = (tmp_path / "kernel_bench.md").read_text()
    assert "| fp32 |" in markdown and "| batch | kernel | us |" in markdown and "Sweep, decode step fp32" in markdown
    peak = data["meta"]["hbm_peak_bytes_per_s"]
    assert peak == 4.3e12 and "HBM peak: 4.30 TB/s" in markdown, "on CPU the shares are of the H200's, named"
    row = timing["rows"][0]
    assert row["hbm_share"] == pytest.approx(row["GB_per_s"] * 1e9 / peak), "each share is of the peak named"
    verify = data["verify"]
    assert verify["status"] == "ok", verify.get("traceback")
    assert verify["tokens_per_row"] == 4 and verify["ring_len"] == SMOKE_PLAN.buffer_len + 4
    assert set(verify["sweep"]) == {"fp32", "split"} and len(verify["sweep"]["split"]["us"]) == 6
    assert {mode: tuple(cfg) for mode, cfg in verify["configs"].items()} == {
        mode: tuple(found["best"]) for mode, found in verify["sweep"].items()
    }, "the verify rows run the verify sweep's winners"
    keys = ("block_p", "block_n", "num_warps", "maxnreg", "mma_stages", "mma_ring", "pdl", "heads_per_program", "tma")
    assert set(verify["coef_sweep"]) == {"fp32", "split"} and len(verify["coef_sweep"]["fp32"]["us"]) == 2
    coefs = {mode: tuple(found["best"]) for mode, found in verify["coef_sweep"].items()}
    assert {mode: tuple(cfg) for mode, cfg in verify["coef_configs"].items()} == coefs, "the coefficient launch's"
    assert table["verify_step"] == {
        mode: {
            **dict(zip(keys, cfg, strict=False)),
            "coef_head_chunk": coefs[mode][0],
            "coef_num_warps": coefs[mode][1],
        }
        for mode, cfg in verify["configs"].items()
    }, "the verify's winners, its coefficient launch's too, reach the launch table (section (d) held them)"
    assert "Sweep, verify coefficient launch fp32 (heads per program x warps" in markdown
    assert "8x16x2x80x2" in verify["sweep"]["fp32"]["us"], "a register cap and tensor-core reads are swept"
    assert "8x16x1x0x2x1" in verify["sweep"]["fp32"]["us"], "and the ring's product on the tensor cores"
    assert "8x16x1x0x2x0x1" in verify["sweep"]["split"]["us"], "and the programmatic dependent launch"
    assert "8x16x1x0x2x0x0x2" in verify["sweep"]["fp32"]["us"], "and programs that walk two heads"
    assert "16x16x1x0x2x0x0x1x1" in verify["sweep"]["split"]["us"], "and the tensor memory accelerator's copies"
    assert set(verify["fold_sweep"]) == {"fp32", "split"} and len(verify["fold_sweep"]["fp32"]["us"]) == 4
    assert set(verify["fold_sweep_per_row"]) == {"fp32", "split"}, "the fold swept without the list too"
    fold_keys = ("block_p", "num_warps", "prefetch", "maxnreg", "programs_per_sm", "block_n")
    assert table["fold"] == {
        mode: dict(zip(fold_keys, (*cfg[:2], bool(cfg[2]), *cfg[3:]), strict=False))
        for mode, cfg in verify["fold_configs"].items()
    }, "so do the fold's, with or without the prefetch, a register cap and a grid size"
    assert "16x4x0x0x2" in verify["fold_sweep"]["fp32"]["us"], "the listed grid's programs per SM are swept"
    assert "16x2x1x0x6x16" in verify["fold_sweep"]["split"]["us"], "and work items of a d_state slice"
    assert "Sweep, verify fold split (block_p x warps x prefetch" in markdown
    assert "Sweep, verify step split" in markdown
    assert verify["baseline"].startswith("none, ReplaySSM timed alone: fp64 reference")
    # the builder's plan at acceptance length 3, L = 4: row 0 appends after 3 committed entries, row 1's 6 fold; the
    # second ring (L = 5) holds the same cursors; at T = 2 (AL 2) rows 0 and 1 append after 2 and 4, none folds
    assert verify["cursors"] == {
        "2": {"rows_folding": 1, "mean_fold_len": 6.0, "mean_history": 1.5},
        "2, L = 5": {"rows_folding": 1, "mean_fold_len": 6.0, "mean_history": 1.5},
        "2, T = 2": {"rows_folding": 0, "mean_fold_len": 0.0, "mean_history": 3.0},
    }
    rows = {(row["batch"], row["kernel"]): row for row in verify["rows"]}
    parts = ("verify step {} (fold + verify)", "verify {} (no row folding)", "fold launch {}")
    timed = (*parts, "of it the coefficient launch {}", "fold launch {}, a program per row")
    rotation = "verify step fp32 (fold + verify), 2 layers' pools of 9 slots in turn, per layer"
    expected = {(batch, part.format(mode) + ring) for batch in SMOKE_PLAN.batches for part in timed
                for mode in ("fp32", "split") for ring in ("", ", L = 5", ", T = 2")}  # fmt: skip
    assert set(rows) == expected | {(2, rotation)}
    # the engine's footprint: the same step as the L = 5 row's, per layer, over a pool per layer
    assert rows[2, rotation]["bytes"] == rows[2, "verify step fp32 (fold + verify), L = 5"]["bytes"]
    assert rows[2, "of it the coefficient launch fp32"]["bytes"] < rows[2, "verify fp32 (no row folding)"]["bytes"]
    assert all(math.isfinite(row["us"]) and row["us"] > 0 for row in rows.values())
    assert all(row["bytes"] > 0 or row["kernel"].startswith("fold launch") for row in rows.values())
    assert rows[2, "fold launch fp32, T = 2"]["bytes"] == 0, "at T = 2 no row folds: the fold moves nothing"
    listed, per_row = rows[2, "fold launch split"], rows[2, "fold launch split, a program per row"]
    assert listed["bytes"] == per_row["bytes"] > 0, "the list and a program per row: the same fold"
    for mode in ("fp32", "split"):
        whole, alone, fold = (rows[2, part.format(mode)]["bytes"] for part in parts)
        assert whole == pytest.approx(alone + fold)
    assert "## Speculative verify timing" in markdown and "| 2 | verify step fp32 (fold + verify) |" in markdown
    spec_eq = data["verify_equivalence"]  # through the builder's cursor plan, against the fp64 recurrence
    assert spec_eq["status"] == "ok" and spec_eq["ok"], spec_eq.get("traceback")
    assert spec_eq["fp32"]["max_rel_err"] <= 2e-5 and spec_eq["fp32"]["final_state_rel_err"] <= 2e-5
    assert 1e-4 < spec_eq["split"]["max_rel_err"] <= 2e-2 and spec_eq["split"]["final_state_rel_err"] <= 2e-5
    assert spec_eq["fp32"]["rows_folded"] >= SMOKE_PLAN.eq_batch, "every row folds at least once"
    assert spec_eq["fp32"]["launch"]["fold"] == table["fold"]["fp32"], "section (d) ran the fold the table holds"
    assert "## Speculative verify equivalence" in markdown and "| fp32 | " in markdown.split("verify equivalence")[1]


@pytest.mark.parametrize("bench", ["mamba", "gdn"])
def test_native_batches_end_where_the_ring_first_beats_vllms_kernel(bench: str) -> None:
    """Each bench's rows decide the plugin's native batches: the largest batch up to which vLLM's kernel (fp32 state)
    was faster at every timed batch, never past a batch where the ring's step won; 0 if it wins at batch 1."""
    from replayssm_patch.gpu import gdn_kernel_bench, kernel_bench
    from replayssm_patch.gpu.bench_common import native_max_batch

    if bench == "mamba":
        vllm_row, ring = kernel_bench.BASELINE_FP32_ROW, kernel_bench.ring_row("fp32")
    else:
        vllm_row, ring = gdn_kernel_bench.BASELINE_ROW, gdn_kernel_bench.RING_ROW

    def chosen(times: dict[int, tuple[float, float]]) -> int:
        rows = [row for batch, (vllm, ours) in times.items() for row in (
            {"batch": batch, "kernel": vllm_row, "us": vllm}, {"batch": batch, "kernel": ring, "us": ours},
            {"batch": batch, "kernel": "replay (no row flushing)", "us": 0.1})]  # fmt: skip
        return native_max_batch(rows, vllm_row, ring)

    today = {1: (3.4, 7.4), 8: (13.3, 14.9), 64: (60.0, 32.4), 256: (230.0, 120.0)}  # the H200's Mamba-2 fp32 shape
    assert chosen(today) == 8
    assert chosen({**today, 16: (20.0, 19.0), 32: (25.0, 30.0)}) == 8, "batch 16 won by the ring ends it: 32 is past"
    assert chosen({**today, 16: (20.0, 21.0), 32: (25.0, 30.0)}) == 32
    assert chosen({1: (7.0, 6.0), 8: (13.3, 14.9)}) == 0, "the ring wins at batch 1: never native"
    assert chosen({1: (6.0, 6.0)}) == 0, "a tie is not faster"
    assert native_max_batch([{"batch": 1, "kernel": ring, "us": 7.4}], vllm_row, ring) == 0, "no baseline row"


def test_mamba_bench_writes_a_native_limit_per_checkpoint() -> None:
    """Each checkpoint's limit from its own rows: the fp32 step loses to vLLM's kernel at batch 1 only (limit 1),
    the split step already wins there (limit 0)."""
    from replayssm_patch.gpu.kernel_bench import BASELINE_FP32_ROW, ring_row, tuned_launch_file

    rows = [{"batch": batch, "kernel": kernel, "us": us} for batch, kernel, us in (
        (1, BASELINE_FP32_ROW, 3.4), (1, ring_row("fp32"), 7.4), (1, ring_row("split"), 2.0),
        (8, BASELINE_FP32_ROW, 13.3), (8, ring_row("fp32"), 12.0), (8, ring_row("split"), 9.0))]  # fmt: skip
    table = tuned_launch_file({"configs": {"fp32": (8, 64, 1), "split": None}, "rows": rows})
    assert table == {"replay_step": {"fp32": {"block_p": 8, "block_n": 64, "num_warps": 1}},
                     "native_max_batch": {"fp32": 1, "split": 0}}  # fmt: skip


def test_launch_table_readers_give_the_native_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The builders' limits come from the table's ``native_max_batch`` and ``gdn_native_max_batch`` entries of the
    checkpoint in use (fp32 or split); a table without them (or no table) means never."""
    import torch

    from replayssm_patch.kernels import launch_config

    def limits(split: bool = False) -> tuple[int, int]:
        launch_config.native_max_batch.cache_clear()
        launch_config.gdn_native_max_batch.cache_clear()
        cpu = torch.device("cpu")
        return launch_config.native_max_batch(cpu, split), launch_config.gdn_native_max_batch(cpu, split)

    monkeypatch.delenv(launch_config.ENV_VAR, raising=False)
    try:
        assert limits() == (0, 0), "no table on the CPU: never native"
        table = tmp_path / "launch_config.json"
        monkeypatch.setenv(launch_config.ENV_VAR, str(table))
        entries = {"native_max_batch": {"fp32": 8, "split": 64}, "gdn_native_max_batch": {"fp32": 16, "split": 4}}
        table.write_text(json.dumps(entries))
        assert (limits(), limits(split=True)) == ((8, 16), (64, 4))
        table.write_text(json.dumps({"native_max_batch": {"split": 64}, "gdn": {"fold_block_v": 32}}))
        assert limits() == (0, 0), "each checkpoint has its own entry, and a GDN sweep alone sets no limit"
    finally:
        monkeypatch.delenv(launch_config.ENV_VAR, raising=False)
        limits()  # leave the caches empty for later tests


def test_the_verify_runs_its_own_swept_shape_else_the_replay_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table's ``verify_step`` entry is the verify's shape; where it lacks one, the verify takes the replay step's
    (the tables written before the verify had a sweep), and without either the default."""
    import torch

    from replayssm_patch.kernels import launch_config

    def shapes(dtype: torch.dtype) -> tuple[str, str]:
        launch_config.launch_for.cache_clear()
        launch_config.verify_launch_for.cache_clear()
        cpu = torch.device("cpu")
        return launch_config.launch_for(dtype, cpu).as_key(), launch_config.verify_launch_for(dtype, cpu).as_key()

    table = tmp_path / "launch_config.json"
    monkeypatch.setenv(launch_config.ENV_VAR, str(table))
    try:
        table.write_text(json.dumps({
            "replay_step": {"fp32": {"block_p": 8, "block_n": 64, "num_warps": 1}},
            "verify_step": {"split": {"block_p": 32, "block_n": 128, "num_warps": 4}},
        }))  # fmt: skip
        assert shapes(torch.float32) == ("8x64x1w", "8x64x1w"), "no fp32 verify entry: the replay step's"
        assert shapes(torch.bfloat16) == ("16x64x1w", "32x128x4w"), "split: the default step, its own verify"
        assert launch_config.launch_shapes_in_use("cpu")["verify"] == "fp32 8x64x1w, split 32x128x4w"
        table.write_text(json.dumps({
            "verify_step": {"fp32": {"block_p": 32, "block_n": 32, "num_warps": 1, "maxnreg": 80}},
            "fold": {"fp32": {"block_p": 16, "num_warps": 4, "prefetch": False, "maxnreg": 168}},
        }))  # fmt: skip
        assert shapes(torch.float32) == ("16x64x1w", "32x32x1w <=80 regs"), "a register cap is part of the shape"
        launch_config.fold_launch_for.cache_clear()
        assert launch_config.fold_launch_for(False, torch.device("cpu")).maxnreg == 168
        assert launch_config.launch_shapes_in_use("cpu")["fold"].startswith("fp32 16x4w <=168 regs")
        split = {"block_p": 32, "block_n": 64, "num_warps": 1, "coef_head_chunk": 16, "coef_num_warps": 2}
        table.write_text(json.dumps({"verify_step": {"split": split}}))
        assert shapes(torch.bfloat16)[1] == "32x64x1w coef 16h2w", "and the coefficient launch's shape"
        walked = {**split, "mma_stages": 3, "heads_per_program": 4, "tma": 1}
        table.write_text(json.dumps({"verify_step": {"split": walked}}))
        assert shapes(torch.bfloat16)[1] == "32x64x1w mma 3 stages 4 heads tma coef 16h2w", "the heads walked, the TMA"
    finally:
        monkeypatch.delenv(launch_config.ENV_VAR, raising=False)
        launch_config.launch_for.cache_clear()
        launch_config.verify_launch_for.cache_clear()
        launch_config.fold_launch_for.cache_clear()


@pytest.mark.parametrize(("kernel", "entry"), [("verify_step", {"fp32": {"block_p": 32, "block_n": 32, "num_warps": 1,
                                                                            "tensor_cores": False}}),
                                               ("gdn", {"replay_block_v": 32, "fold_warps": 4})])  # fmt: skip
def test_a_launch_table_with_unknown_keys_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: str, entry: dict
) -> None:
    """A table another version of the benches wrote (session 20's GPU table carried ``tensor_cores``) names the file,
    the entry, the keys and what to do, rather than a TypeError from a launch."""
    import torch

    from replayssm_patch.kernels import launch_config

    table = tmp_path / "launch_config.json"
    table.write_text(json.dumps({kernel: entry}))
    monkeypatch.setenv(launch_config.ENV_VAR, str(table))
    readers = (lambda: launch_config.verify_launch_for(torch.float32, torch.device("cpu")),
               lambda: launch_config.gdn_launch_for(torch.device("cpu")))  # fmt: skip
    try:
        for read in readers:
            launch_config.verify_launch_for.cache_clear()
            launch_config.gdn_launch_for.cache_clear()
            with pytest.raises(ValueError) as refused:
                read()
            message = str(refused.value)
            unknown = "tensor_cores" if kernel == "verify_step" else "fold_warps"
            assert str(table) in message and f"unknown keys ['{unknown}']" in message and "\n" not in message
            assert "write a new table with the kernel bench" in message
    finally:
        monkeypatch.delenv(launch_config.ENV_VAR, raising=False)
        launch_config.verify_launch_for.cache_clear()
        launch_config.gdn_launch_for.cache_clear()


def test_a_launch_table_with_a_single_native_limit_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table from before the native limits were per checkpoint (``"gdn_native_max_batch": 16``) names the file, the
    entry and the form it needs, rather than an AttributeError from the builder."""
    import torch

    from replayssm_patch.kernels import launch_config

    table = tmp_path / "launch_config.json"
    table.write_text(json.dumps({"gdn_native_max_batch": 16}))
    monkeypatch.setenv(launch_config.ENV_VAR, str(table))
    launch_config.gdn_native_max_batch.cache_clear()
    try:
        with pytest.raises(ValueError) as refused:
            launch_config.gdn_native_max_batch(torch.device("cpu"))
        message = str(refused.value)
        assert str(table) in message and "gdn_native_max_batch is 16" in message and "\n" not in message
        assert '{"fp32": N, "split": M}' in message and "write a new table with the kernel bench" in message
    finally:
        monkeypatch.delenv(launch_config.ENV_VAR, raising=False)
        launch_config.gdn_native_max_batch.cache_clear()


def test_kernel_bench_traffic_model_counts_the_verify_states() -> None:
    """vLLM's speculative update writes a state per query token; the verify reads one checkpoint and the ring."""
    from replayssm_patch.gpu.mamba_bench_setup import Plan, TrafficModel

    model = TrafficModel(Plan(), 256)
    state = 256 * 128 * 64 * 128 * 4
    entry = 128 * 64 * 2 + 8 * 128 * 2 + 128 * 4
    assert model.baseline(4, 4) - model.baseline(4, 1) == 3 * (model.baseline(4, 1) - 2 * state) + 3 * state
    assert model.baseline(4, 4) - model.verify(4, 4, 7.5) == 4 * state - 256 * 11.5 * entry
    assert model.verify(4, 1, 7.5) == model.replay(4)  # a decode step is a one-token verify
    assert model.flush(1 / 6, 0, 18) == pytest.approx((256 * 18 * entry + 2 * state) / 6)  # fp32 read + write


def test_kernel_bench_without_gpu_or_smoke_refuses(tmp_path: Path) -> None:
    done = run_module("replayssm_patch.gpu.kernel_bench", "--out", str(tmp_path), interpret=False, timeout=60)
    assert done.returncode == 2
    assert done.stdout.strip().splitlines()[-1].startswith("error: no CUDA GPU")


def test_gdn_kernel_bench_smoke_runs_on_cpu(tmp_path: Path) -> None:
    from replayssm_patch.kernels.launch_config import GdnLaunch

    done = run_module("replayssm_patch.gpu.gdn_kernel_bench", "--smoke", "--out", str(tmp_path), interpret=False)
    assert done.returncode == 0, done.stdout
    data = json.loads((tmp_path / "gdn_kernel_bench.json").read_text())
    assert "fp64 reference" in data["meta"]["baseline"], "without vLLM the fp64 fallback must be named"
    eq = data["equivalence"]
    assert eq["status"] == "ok", eq.get("traceback")
    assert eq["finite"] and eq["steps"] == 10 and eq["within_target"]
    assert eq["max_rel_err"] <= 1e-5 and eq["final_state_rel_err"] <= 1e-5  # the CPU bar vs fp64
    split = data["split_equivalence"]
    assert split["status"] == "ok", split.get("traceback")
    assert (split["checkpoint"], split["steps"], split["finite"], split["within_target"]) == ("split", 10, True, True)
    # the master stays on the fp64 trajectory; outputs carry the copy's bf16 rounding (test_gdn_split_kernels.py)
    assert split["final_state_rel_err"] <= 1e-5 and 1e-5 < split["max_rel_err"] <= 2**-6
    mixed = data["mixed_equivalence"]
    assert mixed["status"] == "ok", mixed.get("traceback")
    assert "PyTorch causal conv" in mixed["baseline"] and mixed["steps"] == 10 and mixed["finite"]
    # bf16 conv outputs: Triton's interpreter truncates fp32 -> bf16 where torch rounds, so here the arms differ by
    # about one bf16 ulp (2^-8 relative); the tight bars are test_gdn_mixed_decode.py's, the GPU's target is 1e-4
    assert mixed["max_rel_err"] <= 2e-2 and mixed["final_state_rel_err"] <= 2e-2 and mixed["conv_state_equal"]
    sweep = data["sweep"]
    assert sweep["status"] == "ok", sweep.get("traceback")
    assert set(sweep["us"]) == {"16x2", "32x4", "16x1x2"}, "CUDA-core shapes and the tensor-core form are swept"
    assert sweep["spill_bytes"] == {"16x2": None, "32x4": None, "16x1x2": None}
    assert set(sweep["fold_us"]) == {"16x4", "16x4x128x4"}, "the fold sweep (a register cap, a grid per SM too)"
    assert set(sweep["split_fold_us"]) == {"16x4x4", "8x1x16"}, "split precision's fold has shapes of its own"
    table = json.loads((tmp_path / "gdn_launch_config.json").read_text())
    tuned = table["gdn"]
    assert tuned == sweep["best"] and tuned["fold_block_v"] == 16 and tuned["fold_num_warps"] == 4
    assert table["gdn_native_max_batch"] == {"fp32": 0, "split": 0}, "no vLLM baseline row here: never native"
    assert [tuned["replay_block_v"], tuned["replay_num_warps"], tuned.get("replay_mma_stages", 0)] in (
        [16, 2, 0],
        [32, 4, 0],
        [16, 1, 2],
    )
    assert data["timing"]["launch"] == GdnLaunch(**tuned).as_key(), "the timing runs the sweep's fastest shapes"
    timing = data["timing"]
    assert timing["status"] == "ok", timing.get("traceback")
    rows = {row["kernel"]: row for row in timing["rows"]}
    assert set(rows) == {
        "decode step (1/L rows flushing)", "replay (no row flushing)", "decode step (all rows flushing)",
        "mixed-step decode rows, one launch with the conv (1/L rows flushing)", "split decode step (1/L rows flushing)",
        "split replay (no row flushing)",
    }  # fmt: skip
    assert all(row["batch"] == 2 and row["us"] > 0 and row["bytes"] > 0 for row in rows.values())
    replay = rows["replay (no row flushing)"]["bytes"]
    step = rows["decode step (1/L rows flushing)"]["bytes"]
    assert replay < step < rows["decode step (all rows flushing)"]["bytes"]
    assert rows["mixed-step decode rows, one launch with the conv (1/L rows flushing)"]["bytes"] > step, "+ the conv"
    assert rows["split replay (no row flushing)"]["bytes"] < replay, "the bf16 copy read instead of the checkpoint"
    markdown = (tmp_path / "gdn_kernel_bench.md").read_text()
    assert "| 2 | replay (no row flushing) |" in markdown and "Within target: **True**" in markdown


def test_gdn_kernel_bench_traffic_model_counts_what_each_call_must_move() -> None:
    """vLLM's decode reads and writes every state; the replay reads it once; all rows flushing adds the write."""
    from replayssm_patch.gpu.gdn_bench_setup import Plan, TrafficModel

    model = TrafficModel(Plan(), 256)
    state = 256 * 32 * 128 * 128 * 4
    assert model.baseline() - 2 * state == model.replay() - state - 256 * 8.5 * (16 * 128 + 32 * 129) * 4
    assert model.aligned() - model.replay() > state
    assert model.replay() < 0.6 * model.baseline()
    # split precision: half the checkpoint read, plus each row's appended β and raw v
    assert model.replay(split=True) == model.replay() - state / 2 + 256 * 32 * (4 + 2 * 128)
    assert model.fold(1 / 16, split=True) > model.fold(1 / 16), "the master read and written, the copy written"


def test_gdn_kernel_bench_without_gpu_or_smoke_refuses(tmp_path: Path) -> None:
    done = run_module("replayssm_patch.gpu.gdn_kernel_bench", "--out", str(tmp_path), interpret=False, timeout=60)
    assert done.returncode == 2
    assert done.stdout.strip().splitlines()[-1].startswith("error: no CUDA GPU")


def selective_state_update_stand_in(
    state, x, dt, A, B, C, D, dt_bias, z=None, dt_softplus=False, state_batch_indices=None,
    dst_state_batch_indices=None, null_block_id=0, out=None,
):  # fmt: skip
    """vLLM 0.24's selective_state_update contract (its signature, the shapes it asserts; rows whose index is
    null_block_id, default 0, are skipped), in fp64.

    Stands in for vLLM, which this venv lacks, so the benchmark's vLLM code path (argument plumbing, padding,
    error bookkeeping) runs on CPU; the GPU run uses the real one.
    """
    pad_slot_id = null_block_id
    _, nheads, head_dim = x.shape
    d_state = state.shape[-1]
    assert dt.shape == x.shape and A.shape == (nheads, head_dim, d_state) and B.shape == C.shape
    assert D.shape == dt_bias.shape == (nheads, head_dim) and z is None and out.shape == x.shape
    rows = (state_batch_indices != pad_slot_id).nonzero().squeeze(1)
    slots = state_batch_indices[rows].long()
    h = state[slots].double()
    y = recurrence_step_fp64(
        h, x[rows], dt[rows, :, 0], A[:, 0, 0], B[rows], C[rows], D=D[:, 0], dt_bias=dt_bias[:, 0],
        dt_softplus=dt_softplus,
    )  # fmt: skip
    state[slots] = h.to(state.dtype)
    out[rows] = y.to(out.dtype)


def speculative_stand_in(
    state, x, dt, A, B, C, D, dt_bias, z=None, dt_softplus=False, state_batch_indices=None,
    dst_state_batch_indices=None, null_block_id=0, out=None, num_accepted_tokens=None, cu_seqlens=None,
):  # fmt: skip
    """``selective_state_update_stand_in`` plus vLLM 0.24's speculative contract: with num_accepted_tokens and
    cu_seqlens, request n's tokens cu_seqlens[n]..cu_seqlens[n+1]-1 start from the state in block
    state_batch_indices[n, num_accepted_tokens[n] - 1], and the state after its token t goes to block
    dst_state_batch_indices[n, t] (skipped where that is null_block_id)."""
    if num_accepted_tokens is None:
        return selective_state_update_stand_in(
            state, x, dt, A, B, C, D, dt_bias, z, dt_softplus, state_batch_indices, dst_state_batch_indices,
            null_block_id, out,
        )  # fmt: skip
    bounds = cu_seqlens.tolist()
    for n, (first, end) in enumerate(itertools.pairwise(bounds)):
        h = state[state_batch_indices[n, num_accepted_tokens[n] - 1].long()].double()[None]
        for t, i in enumerate(range(first, end)):
            y = recurrence_step_fp64(
                h, x[i : i + 1], dt[i : i + 1, :, 0], A[:, 0, 0], B[i : i + 1], C[i : i + 1], D=D[:, 0],
                dt_bias=dt_bias[:, 0], dt_softplus=dt_softplus,
            )  # fmt: skip
            if dst_state_batch_indices[n, t] != null_block_id:
                state[dst_state_batch_indices[n, t].long()] = h[0].to(state.dtype)
            out[i] = y[0].to(out.dtype)
    return None


def test_kernel_bench_verify_against_a_speculative_stand_in() -> None:
    """The verify section's vLLM path: the probe accepts the speculative call, and its row is the baseline."""
    baseline = Baseline(speculative_stand_in, "stand-in")
    assert verify_problem(baseline, SMOKE_PLAN, "cpu") is None
    verify = run_verify(SMOKE_PLAN, "cpu", baseline)
    assert (
        verify["baseline"].startswith("stand-in: selective_state_update(")
        and "num_accepted_tokens" in verify["baseline"]
    )
    rows = {row["kernel"]: row for row in verify["rows"]}
    base = rows["vllm spec verify (fp32 state, 1+k blocks)"]
    assert base["batch"] == 2 and base["speedup_vs_baseline_fp32"] == pytest.approx(1.0)
    assert all(math.isfinite(row["speedup_vs_baseline_fp32"]) for row in rows.values())
    assert (
        rows["verify split (no row folding)"]["bytes"] < rows["verify fp32 (no row folding)"]["bytes"] < base["bytes"]
    )


def test_a_decode_only_baseline_is_not_the_verify_baseline() -> None:
    """A selective_state_update without 0.24's speculative arguments fails the verify probe: ReplaySSM is timed
    alone, and the note says why."""
    problem = verify_problem(Baseline(selective_state_update_stand_in, "decode only"), SMOKE_PLAN, "cpu")
    assert problem is not None and "decode only (speculative call)" in problem


def test_a_baseline_that_skips_rows_falls_back_to_the_fp64_reference() -> None:
    """The probe call compares against fp64: a baseline leaving a row unwritten is not used (0.24 skipped row 0
    when called with the old pad_slot_id keyword only)."""

    @functools.wraps(selective_state_update_stand_in)  # same signature, so the same keywords reach it
    def skips_slot_zero(*args, null_block_id=0, **kwargs):
        selective_state_update_stand_in(*args, null_block_id=0, **kwargs)

    baseline = Baseline(skips_slot_zero, "skips slot 0").checked(SMOKE_PLAN, "cpu")
    assert baseline.fn is None and "disagreed on a probe call" in baseline.note


def test_kernel_bench_vllm_path_with_a_stand_in(tmp_path: Path) -> None:
    baseline = Baseline(selective_state_update_stand_in, "stand-in").checked(SMOKE_PLAN, "cpu")
    assert baseline.fn is not None, baseline.note
    eq = run_equivalence(SMOKE_PLAN, "cpu", baseline)
    assert eq["fp32"]["max_rel_err"] <= 2e-5 and eq["fp32"]["final_state_rel_err"] <= 2e-5
    assert eq["split"]["max_rel_err"] <= 2e-2 and eq["fp32_within_target"]
    timing = run_timing(SMOKE_PLAN, "cpu", baseline, sweep=False)
    rows = {row["kernel"]: row for row in timing["rows"]}
    assert rows["baseline fp32 state"]["speedup_vs_baseline_fp32"] == pytest.approx(1.0)
    assert rows["baseline bf16 state"]["bytes"] < rows["baseline fp32 state"]["bytes"]
    replay = {mode: rows[f"replay {mode} (no row flushing)"]["bytes"] for mode in ("fp32", "split")}
    assert replay["split"] < replay["fp32"] < rows["baseline fp32 state"]["bytes"]
    staggered = rows["decode step fp32 (1/L rows flushing)"]["bytes"]
    assert replay["fp32"] < staggered < rows["decode step fp32 (all rows flushing)"]["bytes"]
    markdown = render_markdown({"meta": {}, "equivalence": {"status": "ok", "seconds": 0, **eq}, "timing": {
        "status": "ok", **timing}})  # fmt: skip
    assert "| 2 | baseline fp32 state |" in markdown and "1.00x" in markdown


def test_layer_check_without_gpu_refuses_in_one_line(tmp_path: Path) -> None:
    done = run_module("replayssm_patch.gpu.layer_check", "--model", str(tmp_path), "--out", str(tmp_path / "o"),
                      interpret=False, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert done.stdout.strip().splitlines() == [
        "error: no CUDA GPU; this check runs vLLM's own GPU kernels (tests/ hold the CPU version)"
    ]


def test_rows_name_the_launch_shapes_and_their_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """engine_step rows record which replay shapes ran: a tuned file, the H200's committed one, or the defaults."""
    from replayssm_patch.gpu.engine_step import launch_shapes_of
    from replayssm_patch.kernels.launch_config import (
        COMMITTED,
        ENV_VAR,
        GDN_DEFAULT,
        GdnLaunch,
        VerifyLaunch,
        launch_shapes_in_use,
    )

    monkeypatch.delenv(ENV_VAR, raising=False)
    table = json.loads(COMMITTED["H200"].read_text())
    committed = table["replay_step"]["fp32"]
    on_h200 = launch_shapes_in_use("NVIDIA H200")
    assert on_h200["source"] == str(COMMITTED["H200"])
    assert on_h200["fp32"] == f"{committed['block_p']}x{committed['block_n']}x{committed['num_warps']}w"
    gdn_committed = GdnLaunch(**table["gdn"])
    assert on_h200["gdn"] == gdn_committed.as_key() != GDN_DEFAULT.as_key(), "the H200 table holds its GDN sweep"
    assert on_h200["native_batches"] == "fp32 <= 8, split <= 1, gdn fp32 <= 16, gdn split <= 16", "measured limits"
    on_h100 = launch_shapes_in_use("NVIDIA H100 80GB HBM3")  # session 31: its decode-step sweep only
    assert on_h100["source"] == str(COMMITTED["H100"]) and on_h100["split"] == "16x128x1w"
    assert on_h100["gdn"] == GDN_DEFAULT.as_key() and on_h100["native_batches"].startswith("fp32 <= 8, split <= 1,")
    verify = table["verify_step"]  # session 32: both with tensor-core reads, ring product, TMA copies, 16-head coefs
    assert (
        on_h200["verify"]
        == "fp32 32x32x1w mma 3 stages ring mma tma coef 16h4w, split 32x32x1w mma 3 stages ring mma tma coef 16h4w"
        == ", ".join(f"{entry} {VerifyLaunch(**shape).as_key()}" for entry, shape in verify.items())
    )
    assert on_h200["verify"] != f"fp32 {on_h200['fp32']}, split {on_h200['split']}", "the fp32 verify has its own shape"
    never = "fp32 <= 0, split <= 0, gdn fp32 <= 0, gdn split <= 0"  # vLLM's own decode path: none unless measured
    assert launch_shapes_in_use("cpu") == {
        "source": "defaults", "fp32": "16x64x1w", "split": "16x64x1w", "verify": "fp32 16x64x1w, split 16x64x1w",
        "fold": "fp32 16x4w, split 16x4w", "gdn": GDN_DEFAULT.as_key(), "native_batches": never,
    }  # fmt: skip
    tuned = tmp_path / "launch_config.json"
    tuned.write_text(json.dumps({"replay_step": {"split": {"block_p": 32, "block_n": 128, "num_warps": 2}}}))
    monkeypatch.setenv(ENV_VAR, str(tuned))
    assert launch_shapes_of("replayssm_split", "NVIDIA H200") == {
        "source": str(tuned), "fp32": "16x64x1w", "split": "32x128x2w", "verify": "fp32 16x64x1w, split 32x128x2w",
        "fold": "fp32 16x4w, split 16x4w", "gdn": GDN_DEFAULT.as_key(), "native_batches": never,
    }  # fmt: skip
    tuned.write_text(json.dumps({"native_max_batch": {"fp32": 16}, "gdn_native_max_batch": {"split": 4}}))
    native = launch_shapes_in_use("NVIDIA H200")["native_batches"]
    assert native == "fp32 <= 16, split <= 0, gdn fp32 <= 0, gdn split <= 4"
    tuned.write_text(json.dumps({"gdn": {"fold_block_v": 32, "fold_num_warps": 8}}))  # a GDN bench's file
    assert launch_shapes_in_use("NVIDIA H200")["gdn"] == "replay 32x4w, fold 32x8w"
    tuned.write_text(json.dumps({"fold": {"split": {"block_p": 32, "num_warps": 8, "prefetch": True},
                                          "fp32": {"block_p": 16, "num_warps": 2, "block_n": 32}}}))  # fmt: skip
    assert launch_shapes_in_use("NVIDIA H200")["fold"] == "fp32 16x2w n32, split 32x8w prefetch"
    assert launch_shapes_in_use("NVIDIA H200")["fp32"] == "16x64x1w", "an entry the file lacks keeps its defaults"
    assert launch_shapes_of("baseline", "NVIDIA H200") is None


_COMPILE_CURSOR_PLAN = """
from replayssm_patch.kernels import compile_check as cc
from replayssm_patch.kernels.cursor_plan import PLAN_BLOCK, _cursor_plan_kernel
pointers = {name: "*i32" for name in ("slot_ptr", "positions_ptr", "window_end_ptr", "write_pos_ptr", "flush_ptr",
                                      "flush_rows_ptr", "flush_count_ptr")}
cc.compile_for_hopper(_cursor_plan_kernel, pointers, {"HAS_LIST": True, "BLOCK": PLAN_BLOCK}, 4)
"""


def test_engines_of_different_config_hashes_share_one_triton_cache(tmp_path: Path) -> None:
    """vLLM points TRITON_CACHE_DIR into a folder per config hash; with the GPU tooling's cache manager a second
    engine (another hash) finds the kernels the first compiled: a real sm_90 compile, no GPU needed."""
    shared = tmp_path / "shared"
    env = {**os.environ, "TRITON_CACHE_MANAGER": "replayssm_patch.gpu.shared_triton_cache:SharedTritonCache",
           "REPLAYBENCH_TRITON_CACHE": str(shared)}  # fmt: skip
    env.pop("TRITON_INTERPRET", None)
    written = []
    for arm in ("baseline", "candidate"):
        run_env = env | {"TRITON_CACHE_DIR": str(tmp_path / arm / "triton_cache")}
        done = subprocess.run([sys.executable, "-c", _COMPILE_CURSOR_PLAN], env=run_env, capture_output=True,
                              text=True, timeout=300, cwd=REPO)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        written.append(sorted(p.relative_to(shared) for p in shared.rglob("*.cubin")))
        assert not list((tmp_path / arm).rglob("*.cubin")), "nothing is compiled into vLLM's per-hash folder"
    assert written[0] and written[1] == written[0], "the second engine compiled nothing new: a cache hit"
