"""The engine-side step benchmark's CPU parts: arguments, step arithmetic, prompts, rows and the results file.

The module imports here, in a venv without vLLM; its LLM keywords go through vllm 0.24.0's own constructor in
test_vllm_gpu_stages.py.
"""

import json
import multiprocessing
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from replayssm_patch.gpu.decode_window import DecodeWindow
from replayssm_patch.gpu.engine_step import (
    FIRST_TOKEN_ID,
    WHAT,
    Generated,
    Repeat,
    batch_ran_together,
    capture_sizes,
    engine_tpot_s,
    layers_problem,
    llm_kwargs,
    main,
    make_row,
    parser,
    prompt_token_ids,
    repeat_order,
    resolved_batches,
    row_line,
    run_checks,
    sampling_kwargs,
    step_ms,
)
from replayssm_patch.gpu.row_file import RowFileError, merge_rows, read_row_file, record_row
from replayssm_patch.gpu.variants import VARIANTS, server_flags
from replayssm_patch.gpu.variants import main as variants_main


def _args(tmp_path, *extra):
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text("{}")
    return parser().parse_args(["--model", str(tmp_path / "model"), "--out", str(tmp_path / "out.json"), *extra])


def test_defaults_are_the_issues_setting(tmp_path):
    args = _args(tmp_path)
    assert (args.variant, args.mode, args.batches, args.repeats) == ("baseline", "O0", (64, 256), 3)
    assert (args.gpu_memory_utilization, args.max_num_seqs, args.max_model_len) == (0.45, 256, 4096)
    assert args.mamba_ssm_cache_dtype == "float32"


def test_batches_parse_from_a_comma_list_and_bad_ones_are_one_line(tmp_path, capsys):
    assert _args(tmp_path, "--batches", "1,8,32").batches == (1, 8, 32)
    with pytest.raises(SystemExit):
        _args(tmp_path, "--batches", "64,x")
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--batches" in err and "64,256" in err and "fit" in err


def test_fit_is_resolved_to_the_largest_captured_batch_the_engine_holds(tmp_path, capsys):
    """`fit` captures a graph at every multiple of FIT_STEP up to --max-num-seqs, then runs vLLM's maximum
    concurrency (at most --max-num-seqs) rounded down to one of them: its steps never run a larger, padded graph."""
    args = _args(tmp_path, "--batches", "64,fit", "--max-num-seqs", "300")
    assert args.batches == (64, "fit")
    assert llm_kwargs(args)["compilation_config"]["cudagraph_capture_sizes"] == list(range(32, 300, 32))
    assert resolved_batches(args.batches, 227.6, 300) == [64, 224]
    assert resolved_batches(args.batches, 655.0, 300) == [64, 288] and resolved_batches((64, "fit"), 64.2, 256) == [64]
    out = capsys.readouterr().out
    assert "fit: batch 288 (vLLM's maximum concurrency 655.0, --max-num-seqs 300, down to a multiple of 32" in out
    assert resolved_batches(args.batches, None, 300) == [64]
    assert capsys.readouterr().out.strip() == "skipped fit: vLLM reported no maximum concurrency"
    assert resolved_batches(args.batches, 20.0, 300) == [64]
    assert capsys.readouterr().out.strip() == "skipped fit: it holds < 32"


def test_a_speculative_fit_captures_its_verify_steps(tmp_path):
    """Under speculation each captured batch also gets its verify step's B * (1 + k) tokens (session 19's native
    arm ran 222 rows of 4 tokens in the 3,072-token graph before fit batches were captured)."""
    args = _args(tmp_path, "--batches", "128,fit", "--max-num-seqs", "256")
    args.speculative, args.spec_tokens = True, 3
    sizes = capture_sizes(args)
    assert {224, 224 * 4, 128 * 4, 256 * 4} <= set(sizes) and 888 not in sizes and len(sizes) == len(set(sizes))


def test_step_is_the_extra_tokens_time_per_extra_token():
    """The calibration's baseline at B=64: 1.97 s for 16 tokens, 4.36 s for 272 -> (4.36 - 1.97) / 256."""
    assert step_ms(1.97, 4.36) == pytest.approx(9.3359, abs=1e-4)
    assert step_ms(1.0, 2.0, short=10, long=110) == pytest.approx(10.0)


def test_repeats_alternate_which_length_goes_first():
    assert [repeat_order(r) for r in range(4)] == [(16, 272), (272, 16), (16, 272), (272, 16)]


def test_prompts_are_random_ordinary_ids_of_the_asked_shape_and_reproducible():
    a = prompt_token_ids(np.random.default_rng([0, 64]), 64, 1024, 131072)
    b = prompt_token_ids(np.random.default_rng([0, 64]), 64, 1024, 131072)
    assert a == b and len(a) == 64 and {len(p) for p in a} == {1024}
    flat = np.array(a)
    assert flat.min() >= FIRST_TOKEN_ID and flat.max() < 131072
    assert len(np.unique(flat)) > 50_000  # spread over the vocabulary, not a constant
    rng = np.random.default_rng(1)
    assert prompt_token_ids(rng, 2, 8, 100) != prompt_token_ids(rng, 2, 8, 100)  # each call draws fresh prompts
    with pytest.raises(ValueError, match="no ordinary token"):
        prompt_token_ids(rng, 1, 1, FIRST_TOKEN_ID)


def test_sampling_forces_exact_greedy_lengths():
    assert sampling_kwargs(272) == {
        "max_tokens": 272, "min_tokens": 272, "ignore_eos": True, "temperature": 0.0, "detokenize": False,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("config", "family"),
    [
        ("qwen3_5_4b_config.json", {"language_model_only": True, "gdn_prefill_backend": "triton"}),
        ("nemotron_h_8b_config.json", {}),
    ],
)
def test_qwen3_5_runs_text_only_with_triton_gdn_prefill(tmp_path, config, family):
    """The qwen3.5-4b shape is a vision-language checkpoint served text only; GDN prefill avoids FlashInfer's JIT."""
    args = _args(tmp_path, "--variant", "replayssm_fp32")
    (args.model / "config.json").write_text((Path(__file__).parent / config).read_text())
    got = llm_kwargs(args)
    assert {k: got[k] for k in ("language_model_only", "gdn_prefill_backend") if k in got} == family
    assert got["additional_config"] == VARIANTS["replayssm_fp32"]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_llm_keywords_carry_variant_and_mode(tmp_path, variant):
    o0 = llm_kwargs(_args(tmp_path, "--variant", variant, "--mode", "O0"))
    default = llm_kwargs(_args(tmp_path, "--variant", variant, "--mode", "default"))
    captured = {"cudagraph_capture_sizes": [64, 256]}  # the default --batches: only those are captured
    assert o0["optimization_level"] == 0
    assert o0["compilation_config"] == {"cudagraph_mode": "FULL_DECODE_ONLY", **captured}
    assert "optimization_level" not in default and default["compilation_config"] == captured
    every = llm_kwargs(_args(tmp_path, "--variant", variant, "--mode", "default", "--all-capture-sizes"))
    assert "compilation_config" not in every, "vLLM's own capture list: nothing passed"
    assert o0.get("additional_config") == VARIANTS[variant] == default.get("additional_config")
    assert (o0["load_format"], o0["enable_prefix_caching"], o0["gpu_memory_utilization"]) == ("dummy", False, 0.45)
    assert server_flags("O0") == ["-O0", "-cc", '{"cudagraph_mode":"FULL_DECODE_ONLY"}'] and not server_flags("default")


def test_variants_module_prints_what_the_shell_stages_pass_to_vllm(capsys):
    assert variants_main(["replayssm_split"]) == 0
    assert json.loads(capsys.readouterr().out) == VARIANTS["replayssm_split"]
    assert variants_main(["baseline"]) == 0
    assert json.loads(capsys.readouterr().out) == {}
    assert variants_main(["--mode", "O0"]) == 0
    assert capsys.readouterr().out.splitlines() == server_flags("O0")


@pytest.mark.parametrize(
    ("config", "flags"),
    [
        ("qwen3_5_4b_config.json", ["--language-model-only", "--gdn-prefill-backend", "triton"]),
        ("nemotron_h_8b_config.json", []),
    ],
)
def test_variants_module_prints_a_model_familys_server_flags(tmp_path, capsys, config, flags):
    """tools/gpu/session.sh serves every model with these: the same settings the engine-side step gives vllm.LLM."""
    (tmp_path / "config.json").write_text((Path(__file__).parent / config).read_text())
    assert variants_main(["--family", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == flags
    with pytest.raises(SystemExit):
        variants_main(["--family", str(tmp_path / "missing")])
    assert "config.json missing" in capsys.readouterr().err


def test_row_has_mean_step_spread_and_every_repeat(tmp_path):
    args = _args(tmp_path, "--variant", "replayssm_fp32", "--mode", "default")
    repeats = [Repeat(2.0, 4.56, 10.0), Repeat(2.1, 4.5, 9.375), Repeat(1.9, 4.6, 10.547)]
    row = make_row(args, 64, repeats, exact=True, preemptions=0)
    assert (row["variant"], row["mode"], row["batch"]) == ("replayssm_fp32", "default", 64)
    assert row["step_ms"] == pytest.approx(10.0, abs=1e-3)  # the median repeat
    assert row["spread_ms"] == pytest.approx(10.547 - 9.375, abs=1e-3)
    assert (row["t16_s"], row["t272_s"]) == (2.0, pytest.approx(4.553, abs=1e-3))
    assert row["repeats"][1] == {"t_short_s": 2.1, "t_long_s": 4.5, "step_ms": 9.375, "window": None}
    assert len(row["repeats"]) == 3 and (row["window_step_ms"], row["window_steps"]) == (None, 0)
    assert "step 10.000 ms" in row_line(row) and "INVALID" not in row_line(row) and row["stalled_repeats"] == 0
    row |= {"valid": False, "problems": ["3 preemptions: raise --gpu-memory-utilization"]}
    assert row_line(row).endswith("INVALID: 3 preemptions: raise --gpu-memory-utilization")


def test_a_stalled_repeat_is_counted_and_left_out_of_the_step(tmp_path):
    """A short generate that stalled past the long one gives a negative step: the other repeats decide."""
    repeats = [Repeat(2.0, 4.56, 10.0), Repeat(8.6, 4.5, -16.0), Repeat(1.9, 4.6, 10.547)]
    row = make_row(_args(tmp_path), 64, repeats, exact=True, preemptions=0)
    assert row["stalled_repeats"] == 1 and len(row["repeats"]) == 3
    assert row["step_ms"] == pytest.approx((10.0 + 10.547) / 2, abs=1e-3)
    assert row["spread_ms"] == pytest.approx(0.547, abs=1e-3)


def test_a_batch_whose_every_repeat_stalled_has_no_step_and_is_invalid(tmp_path):
    """No repeat measured a step: the row says so instead of a median of negative differences (as the spec row)."""
    repeats = [Repeat(8.6, 4.5, -16.0), Repeat(9.0, 4.6, -17.0)]
    facts = {"exact": True, "preemptions": 0, "valid": True, "problems": []}
    row = make_row(_args(tmp_path), 64, repeats, **facts)
    assert (row["step_ms"], row["spread_ms"], row["stalled_repeats"], row["valid"]) == (None, None, 2, False)
    assert row["problems"] == ["every repeat stalled (its short generate outlasted its long one): no step measured; "
                               "run the batch again"]  # fmt: skip
    assert ": step ?, window step" in row_line(row) and row_line(row).endswith("run the batch again")


def test_row_window_is_the_median_repeat_mean_with_its_spread(tmp_path):
    """Each repeat's long generate gives a decode window; the row takes the median of their means."""
    windows = [DecodeWindow(240, mean, mean - 0.1, mean + 0.5, mean + 9, 256e3 / mean) for mean in (16.2, 15.9, 17.1)]
    repeats = [Repeat(2.0, 6.0, 15.6, windows[0]), Repeat(2.0, 6.1, 16.0, windows[1]), Repeat(2.0, 6.0, 15.6, None)]
    row = make_row(_args(tmp_path), 256, repeats, exact=True, preemptions=0)
    assert (row["window_step_ms"], row["window_spread_ms"], row["window_steps"]) == (16.05, 0.3, 240)
    assert row["window_p90_ms"] == pytest.approx(16.55)
    assert row["window_tokens_per_s"] == pytest.approx((256e3 / 16.2 + 256e3 / 15.9) / 2, abs=0.1)
    assert row["repeats"][0]["window"]["mean_ms"] == 16.2 and row["repeats"][2]["window"] is None
    assert "window step 16.05 ms (spread 0.3, 240 steps)" in row_line(row)


def _row(variant, mode, batch, step):
    return {"variant": variant, "mode": mode, "batch": batch, "step_ms": step}


def test_merge_replaces_the_same_key_and_orders_variant_mode_batch():
    rows = [_row("replayssm_split", "O0", 64, 8.0), _row("baseline", "O0", 256, 23.0)]
    merged = merge_rows(rows, _row("baseline", "default", 64, 9.0))
    merged = merge_rows(merged, _row("baseline", "O0", 256, 22.5))
    assert [(r["variant"], r["mode"], r["batch"], r["step_ms"]) for r in merged] == [
        ("baseline", "O0", 256, 22.5), ("baseline", "default", 64, 9.0), ("replayssm_split", "O0", 64, 8.0),
    ]  # fmt: skip


def test_results_file_accumulates_rows_and_commands_across_runs(tmp_path):
    out = tmp_path / "engine_step-h200.json"
    record_row(out, _row("baseline", "O0", 64, 9.3), WHAT, "cmd A", {"gpu": "H200"})
    record_row(out, _row("replayssm_fp32", "O0", 64, 10.6), WHAT, "cmd B", {"gpu": "H200"})
    record_row(out, _row("baseline", "O0", 64, 9.4), WHAT, "cmd A", {"gpu": "H200 #2"})
    saved = json.loads(out.read_text())
    assert saved["what"] == WHAT and saved["command"] == "cmd A" and saved["commands"] == ["cmd B", "cmd A"]
    assert saved["machine"] == {"gpu": "H200 #2"}
    assert [(r["variant"], r["step_ms"]) for r in saved["rows"]] == [("baseline", 9.4), ("replayssm_fp32", 10.6)]
    assert read_row_file(tmp_path / "absent.json", WHAT) == {"what": WHAT, "rows": []}


@pytest.mark.parametrize("content", ["not json", '["a list"]'])
def test_a_foreign_results_file_is_refused_before_any_engine_starts(tmp_path, capsys, content):
    args = _args(tmp_path)
    args.out.write_text(content)
    with pytest.raises(RowFileError):
        read_row_file(args.out, WHAT)
    assert main(["--model", str(args.model), "--out", str(args.out)]) == 2
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and str(args.out) in out and "--out" in out


def test_a_file_of_another_prompt_length_is_refused_before_any_engine_starts(tmp_path, capsys):
    """The row key leaves the prompt length out: a 256-token row must not replace a 1024-token one. A row without
    the field was measured with 1024-token prompts, the only length before the option."""
    args = _args(tmp_path)
    record_row(args.out, _row("baseline", "default", 256, 16.5), WHAT, "cmd A", {"gpu": "H200"})
    assert main(["--model", str(args.model), "--out", str(args.out), "--prompt-tokens", "256"]) == 2
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and "prompts of 1024 tokens" in out and "--prompt-tokens 256" in out
    row = make_row(_args(tmp_path, "--prompt-tokens", "256"), 64, [Repeat(1.0, 2.0, 3.9)])
    assert row["prompt_tokens"] == 256 and _args(tmp_path).prompt_tokens == 1024


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--batches", "512"], "--max-num-seqs"),
        (["--max-model-len", "1024"], "1296"),
        (["--repeats", "0"], "repeats"),
        (["--prompt-tokens", "0"], "--prompt-tokens"),
        (["--prompt-tokens", "2000", "--max-model-len", "2048"], "2272"),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(tmp_path, capsys, extra, needle):
    args = _args(tmp_path)
    assert main(["--model", str(args.model), "--out", str(args.out), *extra]) == 2
    out = capsys.readouterr().out.strip()
    assert out.startswith("error: ") and out.count("\n") == 0 and needle in out


def test_missing_model_config_is_one_line(tmp_path, capsys):
    assert main(["--model", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o.json")]) == 2
    assert "config.json missing" in capsys.readouterr().out


def test_a_run_whose_layers_do_not_match_its_variant_is_refused():
    assert layers_problem("baseline", 0) is None and layers_problem("replayssm_fp32", 24) is None
    assert "did not load" in layers_problem("replayssm_split", 0)
    assert "inactive" in layers_problem("baseline", 24)
    assert layers_problem("replayssm_fp32", "not checked: RuntimeError: x") is None  # unknown: measured, recorded


def test_engine_tpot_comes_from_vllms_engine_core_timestamps():
    """RequestOutput.metrics with stats on: (last - first token time) / (tokens - 1); absent stats give None."""
    stats = SimpleNamespace(num_generation_tokens=272, first_token_ts=100.0, last_token_ts=102.71)
    assert engine_tpot_s(stats) == pytest.approx(0.01)
    assert engine_tpot_s(None) is None
    assert engine_tpot_s(SimpleNamespace(num_generation_tokens=1, first_token_ts=1.0, last_token_ts=1.0)) is None


def _stats(first, last, tokens=272):
    return SimpleNamespace(num_generation_tokens=tokens, first_token_ts=first, last_token_ts=last)


def test_a_batch_ran_together_when_every_first_token_precedes_every_last():
    assert batch_ran_together([_stats(1.0, 5.0), _stats(2.0, 6.0)]) is True
    assert batch_ran_together([_stats(1.0, 3.0), _stats(3.5, 6.0)]) is False  # a second wave: it waited for room
    assert batch_ran_together([None, None]) is None


def test_row_checks_name_every_reason_a_step_would_be_wrong():
    good = Generated(5.0, True, [0.02, 0.03], True)
    runs = [(16, Generated(2.0, True, [], False)), (272, good)]  # a short run never has everyone at once: fine
    ok = run_checks(runs, preempted=0)
    assert ok["valid"] and ok["problems"] == [] and ok["engine_tpot_ms"] == pytest.approx(25.0)
    bad = run_checks([(16, Generated(2.0, False, [], None)), (272, Generated(5.0, True, [], False))], preempted=2)
    assert not bad["valid"] and bad["engine_tpot_ms"] is None
    assert [p.split(" ")[0] for p in bad["problems"]] == ["some", "2", "the"]
    assert "unreadable" in run_checks([(272, good)], preempted=None)["problems"][0]


def _record_many(path, variant, count):
    for batch in range(1, count + 1):
        record_row(path, _row(variant, "O0", batch, float(batch)), WHAT, f"cmd {variant}", {})


def test_engines_on_several_gpus_merge_into_one_file_without_losing_rows(tmp_path):
    """paired.sh `steps` runs one engine per GPU, all writing engine_step-h200.json."""
    out = tmp_path / "engine_step-h200.json"
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_record_many, args=(out, v, 15)) for v in VARIANTS]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert [w.exitcode for w in workers] == [0] * len(VARIANTS)
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 15 * len(VARIANTS) and [r["variant"] for r in rows[::15]] == list(VARIANTS)
