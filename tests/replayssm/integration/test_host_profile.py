"""host_profile.py's arithmetic on real cProfile stats: a function's cost per step is the long run's minus the short."""

from __future__ import annotations

import cProfile
import pstats

from replayssm_patch.gpu.host_profile import (
    AllocatorCounts,
    GcPauses,
    allocator_per_step,
    arm_difference,
    baseline_of,
    cost_fields,
    function_name,
    host_slowdown,
    main,
    pause_lines,
    per_step_costs,
    short_path,
    summary_markdown,
    top,
)


def busy(n: int) -> int:
    """Half its work in its own frame (self time), half in a generator (inside its total only): both differences
    per step stay far above the run-to-run noise of a loaded machine (a bare ``sum(genexpr)`` left busy's own time
    near zero, and a clean clone once measured it at -8 µs)."""
    own = 0
    for i in range(n):
        own += i * i
    return own + sum(i * i for i in range(n))


def run(steps: int) -> dict:
    """Raw pstats of `steps` calls of busy() after a fixed set-up call (the 'prefill' both runs share)."""
    profile = cProfile.Profile()
    profile.enable()
    busy(200_000)
    for _ in range(steps):
        busy(20_000)
    profile.disable()
    return pstats.Stats(profile).stats


def test_per_step_cost_is_the_difference_over_the_extra_steps():
    costs = {c.function: c for c in per_step_costs(run(16), run(272), 256)}
    (name,) = [n for n in costs if n.endswith("(busy)")]
    assert costs[name].calls == 1.0, "one extra busy() call per extra step; the shared set-up call cancels"
    assert 0 < costs[name].self_us < costs[name].total_us, "busy's generator expression is inside its total"
    ranked = top(costs.values(), "total_us", count=3)
    assert len(ranked) == 3 and ranked[0]["total_us"] >= ranked[1]["total_us"] >= ranked[2]["total_us"]


def test_names_start_at_the_package_root():
    assert short_path("/tmp/site/vllm/v1/core/sched/scheduler.py") == "vllm/v1/core/sched/scheduler.py"
    assert short_path("/x/site-packages/torch/nn/modules/module.py") == "torch/nn/modules/module.py"
    assert short_path("/tmp/torch/.venv/site-packages/torch/autograd/grad_mode.py") == "torch/autograd/grad_mode.py"
    assert short_path("/repo/replayssm_patch/backend.py") == "replayssm_patch/backend.py"
    assert short_path("/usr/lib/python3.12/threading.py") == "/usr/lib/python3.12/threading.py"
    assert function_name(("/tmp/site/vllm/x.py", 12, "schedule")) == "vllm/x.py:12(schedule)"
    assert function_name(("~", 0, "<method 'tolist' of 'torch._C.TensorBase' objects>")).startswith("<method 'tolist'")


def test_summary_lists_each_rows_functions():
    costs = per_step_costs(run(1), run(3), 2)
    row = {"variant": "baseline", "mode": "O0", "batch": 256, "step_ms": 14.1, "profiled_step_ms": 30.2,
           "by_self": top(costs, "self_us"), "by_total": top(costs, "total_us")}  # fmt: skip
    text = summary_markdown([row])
    assert "## baseline O0 batch 256: step 14.1 ms in-process (30.2 ms profiled)" in text
    assert "(busy)` |" in text and text.count("| function (") == 2


def test_missing_model_is_one_error_line(tmp_path, capsys):
    assert main(["--model", str(tmp_path), "--out", str(tmp_path / "p.json")]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"error: {tmp_path / 'config.json'} missing; give --model a dir holding the model's config.json"]
    assert not (tmp_path / "p.json").exists()


def extra(n: int) -> int:
    return sum(i * i for i in range(n))


def arm_stats(steps: int, candidate: bool) -> dict:
    """Raw pstats of `steps` busy() calls; the candidate also calls extra() on every step."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(steps):
        busy(5_000)
        if candidate:
            extra(20_000)
    profile.disable()
    return pstats.Stats(profile).stats


def _row(variant: str, stats: dict, steps: int = 10, **fields) -> dict:
    costs = per_step_costs({}, stats, steps)
    return {"variant": variant, "mode": "default", "batch": 64, "prompt_tokens": 1024, "output_tokens": 192,
            "step_ms": 1.0, "profiled_step_ms": 2.0, **cost_fields(costs), **fields}  # fmt: skip


def test_arm_difference_names_the_function_only_the_candidate_runs():
    baseline, candidate = _row("baseline", arm_stats(10, False)), _row("replayssm_fp32", arm_stats(10, True))
    by_self = arm_difference(candidate, baseline, "self_us")
    assert any(f["function"].endswith(("(extra)", "(<genexpr>)")) for f in by_self[:3]), "its own frames lead"
    assert by_self[0]["extra_us"] > 0
    by_total = {f["function"]: f for f in arm_difference(candidate, baseline, "total_us")}
    (name,) = [n for n in by_total if n.endswith("(extra)")]
    mine = {f[0]: f for f in candidate["functions"]}
    assert by_total[name]["extra_us"] == mine[name][2] > 0, "absent from the baseline: all of it is extra"
    assert by_total[name]["calls"] == 1.0
    assert all(f[2] >= 1.0 for f in candidate["functions"]), "functions under FUNCTION_FLOOR_US are left out"


def test_baseline_of_matches_mode_batch_and_lengths():
    baseline = _row("baseline", arm_stats(2, False))
    other_batch = _row("baseline", arm_stats(2, False), batch=128)
    candidate = _row("replayssm_fp32", arm_stats(2, True))
    assert baseline_of(candidate, [other_batch, candidate, baseline]) is baseline
    assert baseline_of(candidate, [other_batch, candidate]) is None
    no_functions = {k: v for k, v in baseline.items() if k != "functions"}  # rows written before the field
    assert baseline_of(candidate, [no_functions]) is None


def test_summary_adds_the_candidates_extra_over_its_baseline():
    baseline, candidate = _row("baseline", arm_stats(10, False)), _row("replayssm_fp32", arm_stats(10, True))
    text = summary_markdown([baseline, candidate], title="Host time per step under churn", what="w")
    assert text.startswith("# Host time per step under churn (cProfile, engine in-process)")
    assert "## replayssm_fp32 over the baseline, default batch 64: 1.0 vs 1.0 ms per step in-process" in text
    assert text.count("| function (inclusive) | extra µs per step |") == 1
    assert "over the baseline" not in summary_markdown([candidate])


def test_gc_pauses_counts_each_generations_collections_while_active():
    import gc

    with GcPauses() as pauses:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
    gc.collect(2)  # after the block: not counted
    per_step = pauses.per_step(2)
    assert per_step["collections"][0] >= 0.5 and per_step["collections"][2] == 1.0
    assert all(ms >= 0 for ms in per_step["ms"]) and sum(per_step["ms"]) > 0


def test_churn_host_profile_refuses_bad_input_in_one_line(tmp_path, capsys):
    from replayssm_patch.gpu import churn_host_profile

    assert churn_host_profile.main(["--model", str(tmp_path), "--out", str(tmp_path / "p.json")]) == 2
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith("error: ") and "config.json missing" in line
    (tmp_path / "config.json").write_text("{}")
    assert churn_host_profile.main(["--model", str(tmp_path), "--steps", "0", "--out", str(tmp_path / "p.json")]) == 2
    assert capsys.readouterr().out.strip() == "error: --steps must be at least 1 (got 0)"
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert churn_host_profile.main(["--model", str(tmp_path), "--out", str(bad)]) == 2
    assert "not a results file" in capsys.readouterr().out and bad.read_text() == "[1, 2]"


def test_window_fields_name_every_field_even_without_timestamps():
    from replayssm_patch.gpu.churn_host_profile import window_fields

    assert window_fields(None) == dict.fromkeys(
        ("step_ms", "mixed_step_ms", "decode_step_ms", "mixed_share", "mean_rows")
    )
    assert window_fields(None, "profiled_") == {"profiled_step_ms": None}


def test_allocator_per_step_is_each_counters_growth_over_the_steps():
    before = {"num_device_alloc": 10, "num_device_free": 4, "num_alloc_retries": 0}
    after = {"num_device_alloc": 30, "num_device_free": 24, "num_alloc_retries": 5, "num_sync_all_streams": 3}
    assert allocator_per_step(before, after, 10) == {
        "num_device_alloc": 2.0, "num_device_free": 2.0, "num_alloc_retries": 0.5, "num_sync_all_streams": 0.3
    }  # fmt: skip
    assert allocator_per_step(None, after, 10) is None


def test_allocator_counts_are_none_without_cuda():
    import torch

    with AllocatorCounts() as counts:
        torch.zeros(4)
    assert (counts.per_step(1) is None) == (not torch.cuda.is_available())


def test_summary_names_gc_pauses_and_allocator_calls_of_a_row():
    row = {"gc_per_step": {"collections": [1, 0, 0.1], "ms": [0.1, 0.0, 2.0]},
           "allocator_per_step": {"num_device_alloc": 0.5, "num_device_free": 0.5}}  # fmt: skip
    assert pause_lines(row) == [
        "- GC pauses per step: 2.100 ms (generations 0/1/2: 0.1/0.0/2.0)",
        "- CUDA allocator per step: num_device_alloc 0.5, num_device_free 0.5",
        "",
    ]
    assert pause_lines({"gc_per_step": None, "allocator_per_step": None}) == []


def _scaled(functions: list[list], variant: str = "replayssm_fp32") -> dict:
    return {"variant": variant, "mode": "default", "batch": 64, "prompt_tokens": 1024, "output_tokens": 192,
            "step_ms": 1.0, "profiled_step_ms": 2.0, "by_total": [], "by_self": [], "functions": functions}  # fmt: skip


SCHEDULE = "vllm/v1/core/sched/scheduler.py:388(schedule)"
OUTPUTS = "vllm/v1/engine/output_processor.py:576(process_outputs)"
SHARED = "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:1699(qwen_gdn_attention_core)"


def test_arm_difference_scales_the_baseline_by_the_hosts_slowdown():
    """The host ran the baseline's profiled run 1.25x slower (its scheduler and output processing, unchanged by the
    plugin, took 1.25x as long): the shared op's 18.4 ms there are 14.7 ms at the candidate's pace, so the
    candidate's 18.1 ms are 3.4 ms extra, not 0.3 ms less."""
    baseline = _scaled([[SCHEDULE, 0, 6500.0, 1.0], [OUTPUTS, 0, 1000.0, 1.0], [SHARED, 0, 18400.0, 7.88]], "baseline")
    candidate = _scaled([[SCHEDULE, 0, 5200.0, 1.0], [OUTPUTS, 0, 800.0, 1.0], [SHARED, 0, 18100.0, 7.88]])
    assert host_slowdown(candidate, baseline) == 0.8
    extra = {f["function"]: f["extra_us"] for f in arm_difference(candidate, baseline, "total_us")}
    assert extra[SHARED] == 18100.0 - 0.8 * 18400.0
    assert extra[SCHEDULE] == extra[OUTPUTS] == 0.0  # the reference itself differs by nothing once scaled


def test_host_slowdown_is_unknown_without_the_reference_functions_and_nothing_is_scaled():
    baseline = _scaled([[SHARED, 0, 100.0, 1.0]], "baseline")
    candidate = _scaled([[SHARED, 0, 130.0, 1.0]])
    assert host_slowdown(candidate, baseline) is None
    assert arm_difference(candidate, baseline, "total_us")[0]["extra_us"] == 30.0
    assert "the host's speed in the two runs not known" in summary_markdown([baseline, candidate])
