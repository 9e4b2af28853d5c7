"""host_profile.py's arithmetic on real cProfile stats: a function's cost per step is the long run's minus the short."""

from __future__ import annotations

import cProfile
import pstats

from replayssm_patch.gpu.host_profile import function_name, main, per_step_costs, short_path, summary_markdown, top


def busy(n: int) -> int:
    return sum(i * i for i in range(n))


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
