"""The speculative-decoding step benchmark's CPU parts: arms, options, rows, the AL-parity check, the sweep's child
engines, the results file and the markdown summary.

The module imports here, in a venv without vLLM; its LLM keywords go through vllm 0.24.0's own constructor and its
flow runs against a stand-in engine that counts through vLLM's own Prometheus logger in test_vllm_gpu_stages.py.
"""

import json
import shutil
from pathlib import Path

import pytest

from harness.analysis.server_metrics import parse_snapshots
from harness.analysis.spec_decode import spec_decode_run
from harness.records.decision_config import DecisionConfig
from harness.records.metric_registry import DEFAULT_ACCEPTANCE_TOLERANCE
from replayssm_patch.gpu.engine_step import Generated, llm_kwargs, run_checks
from replayssm_patch.gpu.row_file import record_row
from replayssm_patch.gpu.spec_step import (
    EXIT_NOTHING_MEASURED,
    SPEC_KEY,
    WHAT,
    SpecRepeat,
    acceptance_problem,
    arm_kwargs,
    child_command,
    engine_step_ms,
    main,
    make_row,
    parse_args,
    row_line,
    tokens_per_s,
)
from replayssm_patch.gpu.spec_summary import summary_markdown
from replayssm_patch.gpu.variants import SPEC_ARMS, VARIANTS

HERE = Path(__file__).resolve().parent


def _argv(tmp_path, *extra, config="nemotron_h_8b_mtp"):
    model = tmp_path / config
    model.mkdir(exist_ok=True)
    shutil.copy(HERE / f"{config}_config.json", model / "config.json")
    return ["--model", str(model), "--out", str(tmp_path / "spec.json"), *extra]


def _args(tmp_path, *extra):
    return parse_args(_argv(tmp_path, *extra))


def test_defaults_are_k3_al3_and_the_arm_picks_variant_and_speculation(tmp_path):
    args = _args(tmp_path, "--arm", "replayssm_spec")
    assert (args.spec_tokens, args.acceptance_length, args.sweep_al, args.repeats) == (3, 3.0, None, 3)
    assert (args.variant, args.speculative, args.batches, args.mode) == ("replayssm_fp32", True, (64, 256), "O0")
    assert [SPEC_ARMS[a] for a in SPEC_ARMS] == [("baseline", False), ("baseline", True),
                                                 ("replayssm_fp32", False), ("replayssm_fp32", True),
                                                 ("replayssm_split", True), ("replayssm_fp32_l28", True),
                                                 ("replayssm_split_l28", True),
                                                 ("replayssm_fp32_l28_per_group", True)]  # fmt: skip
    assert _args(tmp_path, "--arm", "native_standard").speculative is False


def test_a_sweep_of_one_length_is_that_length_and_bad_lists_are_one_line(tmp_path, capsys):
    swept = _args(tmp_path, "--arm", "native_spec", "--sweep-al", "1.0,2.8,4")
    assert swept.sweep_al == (1.0, 2.8, 4.0) and swept.acceptance_length == 3.0
    single = _args(tmp_path, "--arm", "native_spec", "--acceptance-length", "2", "--sweep-al", "2.8")
    assert (single.sweep_al, single.acceptance_length) == (None, 2.8)
    with pytest.raises(SystemExit):
        _args(tmp_path, "--arm", "native_spec", "--sweep-al", "2.8,x")
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--sweep-al" in err and "1.0,2.8,3.0" in err


@pytest.mark.parametrize("arm", list(SPEC_ARMS))
def test_llm_keywords_are_the_variants_plus_mtp_with_synthetic_acceptance_for_spec_arms(tmp_path, arm):
    args = _args(tmp_path, "--arm", arm, "--spec-tokens", "5", "--acceptance-length", "2.8", "--mode", "default")
    variant, speculative = SPEC_ARMS[arm]
    base = llm_kwargs(args)
    assert base.get("additional_config") == VARIANTS[variant]
    assert arm_kwargs(args) == ({"speculative_config": {
        "method": "mtp", "num_speculative_tokens": 5, "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": 2.8}} if speculative else {})  # fmt: skip
    assert not set(arm_kwargs(args)) & set(base)  # the arm only adds; the engine settings stay engine_step's
    # graphs at the measured steps only: B tokens a decode step, B * (1 + k) a verify step (past vLLM's 512 cap)
    verify = [b * 6 for b in args.batches] if speculative else []
    assert base["compilation_config"]["cudagraph_capture_sizes"] == sorted({*args.batches, *verify})


def test_rates_and_step_times_from_the_two_generates():
    """B=64, 1.97 s for 16 tokens and 4.36 s for 272: 64 * 256 / 2.39 tokens/s; 6 and 92 engine steps (AL 3)."""
    assert tokens_per_s(64, 1.97, 4.36) == pytest.approx(6855.23, abs=0.01)
    assert engine_step_ms(SpecRepeat(1.97, 4.36, 6, 92)) == pytest.approx(2390 / 86)
    assert engine_step_ms(SpecRepeat(1.97, 4.36, None, 92)) is None
    assert engine_step_ms(SpecRepeat(1.97, 4.36, 92, 92)) is None


def test_acceptance_parity_uses_the_harness_tolerance():
    assert DecisionConfig.model_fields["acceptance_tolerance"].default == DEFAULT_ACCEPTANCE_TOLERANCE == 0.05
    assert acceptance_problem(3.0, 3.0) is None and acceptance_problem(3.0, 2.86) is None  # 4.7 % off
    off = acceptance_problem(3.0, 2.8)
    assert off.startswith("measured acceptance length 2.800 is 6.7% off the configured 3 (tolerance 5%)")
    assert acceptance_problem(3.0, 2.8, tolerance=0.1) is None
    assert "did not speculate" in acceptance_problem(2.8, None)
    assert "without speculation" in acceptance_problem(None, 2.0)
    assert acceptance_problem(None, None) is None


def _counters(drafts, accepted, steps, k=3):
    """/metrics text as vLLM 0.24 serves it: the spec-decode counters and the iteration histogram."""
    lines = ["# TYPE vllm:iteration_tokens_total histogram", f"vllm:iteration_tokens_total_count {steps}",
             f"vllm:iteration_tokens_total_sum {steps}"]  # fmt: skip
    if drafts is not None:
        lines += ["# TYPE vllm:spec_decode_num_drafts counter", f"vllm:spec_decode_num_drafts_total {drafts}",
                  "# TYPE vllm:spec_decode_num_draft_tokens counter",
                  f"vllm:spec_decode_num_draft_tokens_total {k * drafts}",
                  "# TYPE vllm:spec_decode_num_accepted_tokens counter",
                  f"vllm:spec_decode_num_accepted_tokens_total {accepted}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def _counted(drafts, accepted, steps):
    zero = _counters(0 if drafts is not None else None, 0, 0)
    return spec_decode_run(parse_snapshots(zero, _counters(drafts, accepted, steps)), 1.0, None)


def _row(tmp_path, arm, accepted_per_draft, problems=()):
    args = _args(tmp_path, "--arm", arm)
    spec = args.speculative
    repeats = [SpecRepeat(1.0, 3.0, 6, 92), SpecRepeat(1.1, 3.0, 6, 92), SpecRepeat(1.0, 3.2, 6, 92)]
    drafts = 4 * 96 if spec else None
    counted = [_counted(drafts, None if drafts is None else accepted_per_draft * drafts, 98)] * 3
    checks = run_checks([(16, Generated(1.0, True, [], None)), (272, Generated(3.0, True, [0.01], True))], 0)
    checks["problems"] += list(problems)
    return make_row(args, 4, repeats, counted, **checks)


def test_a_stalled_repeat_stays_in_the_row_but_out_of_the_time_difference(tmp_path):
    """Session 27's native spec row: one repeat's short generate stalled past its long one (a negative rate, a
    spread of 27,508 tok/s); the other repeats' difference decides, and the row says one was left out."""
    args = _args(tmp_path, "--arm", "native_spec")
    repeats = [SpecRepeat(1.0, 3.0, 6, 92), SpecRepeat(8.6, 3.0, 6, 92), SpecRepeat(1.0, 3.2, 6, 92)]
    counted = [_counted(4 * 96, 2.0 * 4 * 96, 98)] * 3
    checks = run_checks([(16, Generated(1.0, True, [], None)), (272, Generated(3.0, True, [0.01], True))], 0)
    row = make_row(args, 4, repeats, counted, **checks)
    assert row["stalled_repeats"] == 1 and len(row["repeats"]) == 3 and row["valid"]
    assert row["tokens_per_s_spread"] == pytest.approx(4 * 256 / 2.0 - 4 * 256 / 2.2, abs=0.1)
    assert row["step_ms"] == pytest.approx(2100 / 86, abs=1e-3)


def test_row_holds_medians_spreads_and_the_measured_acceptance(tmp_path):
    row = _row(tmp_path, "replayssm_spec", 2.0)
    assert (row["arm"], row["mode"], row["batch"], row["variant"]) == ("replayssm_spec", "O0", 4, "replayssm_fp32")
    assert (row["spec_tokens"], row["acceptance_length_configured"], row["acceptance_length_measured"]) == (3, 3.0, 3.0)
    assert row["drafts"] == 3 * 4 * 96 and row["speculative_config"]["synthetic_acceptance_length"] == 3.0
    assert row["tokens_per_s"] == pytest.approx(4 * 256 / 2.0) and row["tokens_per_s_spread"] == pytest.approx(
        4 * 256 / 1.9 - 4 * 256 / 2.2, abs=0.1
    )
    assert row["step_ms"] == pytest.approx(2000 / 86, abs=1e-3)
    assert row["step_ms_spread"] == pytest.approx((2200 - 1900) / 86, abs=1e-3)
    assert row["valid"] and row["problems"] == [] and row["preemptions"] == 0 and row["engine_tpot_ms"] == 10.0
    assert row["stalled_repeats"] == 0
    assert row["repeats"][1] == {"t_short_s": 1.1, "t_long_s": 3.0, "steps_short": 6, "steps_long": 92, "window": None}
    assert "replayssm_spec O0 k=3 AL=3 B=4: 512.0 tok/s" in row_line(row) and "INVALID" not in row_line(row)


def test_a_row_whose_measured_acceptance_is_off_is_invalid_and_keeps_the_other_problems(tmp_path):
    row = _row(tmp_path, "native_spec", 1.5, problems=["2 preemptions: raise --gpu-memory-utilization"])
    assert row["acceptance_length_measured"] == 2.5 and not row["valid"]
    assert row["problems"][0].startswith("2 preemptions") and "16.7% off the configured 3" in row["problems"][1]
    assert row_line(row).endswith("its speed is not comparable")


def test_a_standard_row_has_no_speculation_and_no_acceptance(tmp_path):
    row = _row(tmp_path, "native_standard", 0.0)
    assert row["spec_tokens"] == 0 and row["acceptance_length_configured"] is None
    assert row["acceptance_length_measured"] is None
    assert row["speculative_config"] is None and row["drafts"] == 0 and row["valid"]


def test_rows_merge_by_arm_mode_k_al_batch_in_arm_order(tmp_path):
    out = tmp_path / "spec_step-h200.json"
    made = [("replayssm_spec", 3, 2.8, 64), ("native_standard", 0, None, 256), ("replayssm_spec", 3, 2.8, 8),
            ("native_spec", 3, 3.0, 64), ("replayssm_spec", 3, 2.0, 64), ("native_standard", 0, None, 64)]  # fmt: skip
    for arm, k, al, batch in [*made, ("replayssm_spec", 3, 2.8, 64)]:
        row = {"arm": arm, "mode": "default", "spec_tokens": k, "acceptance_length_configured": al, "batch": batch}
        record_row(out, row | {"tokens_per_s": batch}, WHAT, "cmd", {}, SPEC_KEY)
    rows = json.loads(out.read_text())["rows"]
    assert [(r["arm"], r["acceptance_length_configured"], r["batch"]) for r in rows] == [
        ("native_standard", None, 64), ("native_standard", None, 256), ("native_spec", 3.0, 64),
        ("replayssm_spec", 2.0, 64), ("replayssm_spec", 2.8, 8), ("replayssm_spec", 2.8, 64),
    ]  # fmt: skip


def test_each_swept_length_runs_as_a_child_engine_of_that_length_alone(tmp_path):
    argv = _argv(tmp_path, "--arm", "replayssm_spec", "--sweep-al", "1,2.8", "--budget-s", "500")
    command = child_command(argv, 2.8, 321.6)
    assert command[1:3] == ["-m", "replayssm_patch.gpu.spec_step"] and command[3 : 3 + len(argv)] == argv
    child = parse_args(command[3:])
    assert (child.sweep_al, child.acceptance_length, child.budget_s, child.arm) == (None, 2.8, 322.0, "replayssm_spec")
    assert "--budget-s" not in child_command(argv[:-2], 1.0, None)


def test_a_spent_budget_starts_no_engine_and_asks_to_be_run_again(tmp_path, capsys):
    """75 (EX_TEMPFAIL): tools/gpu/replayssm.sh's queue then keeps the job for the next call, not marks it done."""
    argv = _argv(tmp_path, "--arm", "native_spec", "--sweep-al", "1,2.8,4", "--budget-s", "0")
    assert main(argv) == EXIT_NOTHING_MEASURED == 75
    assert capsys.readouterr().out.strip() == "skipped AL 1 and later: --budget-s 0 spent"
    assert not (tmp_path / "spec.json").exists()


@pytest.mark.parametrize(
    ("extra", "needle", "config"),
    [
        (["--arm", "native_spec", "--spec-tokens", "0"], "--spec-tokens must be at least 1", "nemotron_h_8b_mtp"),
        (["--arm", "native_spec", "--sweep-al", "2,4.5"], "4.5 is outside [1, 4]", "nemotron_h_8b_mtp"),
        (["--arm", "replayssm_spec", "--spec-tokens", "1", "--acceptance-length", "3"], "outside [1, 2]",
         "nemotron_h_8b_mtp"),
        (["--arm", "native_standard", "--sweep-al", "2,3"], "drop it for native_standard", "nemotron_h_8b_mtp"),
        (["--arm", "replayssm_spec"], "declares no MTP layer", "nemotron_h_8b"),
        (["--arm", "native_spec", "--batches", "512"], "--max-num-seqs", "nemotron_h_8b_mtp"),
        (["--arm", "native_spec", "--repeats", "0"], "--repeats must be at least 1", "nemotron_h_8b_mtp"),
        (["--arm", "native_spec", "--profile-batches", "64"], "--profile-batches and --profile-out go together",
         "nemotron_h_8b_mtp"),
        (["--arm", "native_spec", "--profile-batches", "64", "--profile-out", ".", "--steps", "0"],
         "--steps must be at least 1", "nemotron_h_8b_mtp"),
    ],
)  # fmt: skip
def test_bad_settings_are_one_line_and_exit_2(tmp_path, capsys, extra, needle, config):
    assert main(_argv(tmp_path, *extra, config=config)) == 2
    out = capsys.readouterr().out.strip()
    assert out.startswith("error: ") and out.count("\n") == 0 and needle in out


def test_a_standard_arm_runs_on_a_model_without_mtp(tmp_path):
    args = parse_args(_argv(tmp_path, "--arm", "replayssm_standard", config="nemotron_h_8b"))
    assert arm_kwargs(args) == {} and llm_kwargs(args)["additional_config"] == VARIANTS["replayssm_fp32"]


def _summary_row(arm, batch, rate, *, step=10.0, measured=None, valid=True, concurrency=None, al=2.8, window=None):
    spec = SPEC_ARMS[arm][1]
    return {"arm": arm, "mode": "default", "batch": batch, "spec_tokens": 3 if spec else 0,
            "acceptance_length_configured": al if spec else None, "acceptance_length_measured": measured,
            "tokens_per_s": rate, "step_ms": step, "max_concurrency": concurrency, "valid": valid,
            "problems": [] if valid else ["the batch did not run at once"], "window_tokens_per_s": window}  # fmt: skip


SUMMARY_ROWS = [
    _summary_row("native_standard", 128, 8000.0, concurrency=120.0),
    _summary_row("native_spec", 128, 6000.0, step=40.0, measured=2.81, concurrency=40.0),
    _summary_row("replayssm_standard", 128, 9000.0, concurrency=130.0),
    _summary_row("replayssm_spec", 128, 12000.0, step=20.0, measured=2.79, concurrency=121.0, window=12500.0),
    _summary_row("replayssm_split_spec", 128, 13200.0, step=18.0, measured=2.8, concurrency=121.0),
    _summary_row("replayssm_spec_l28", 128, 12600.0, step=19.0, measured=2.8, concurrency=118.0),
    _summary_row("replayssm_split_spec_l28", 128, 13500.0, step=17.5, measured=2.8, concurrency=118.0),
    _summary_row("native_spec", 256, 5000.0, step=90.0, measured=2.8, valid=False, concurrency=40.0),
    _summary_row("replayssm_spec", 256, 15000.0, step=30.0, measured=2.8, concurrency=121.0),
    _summary_row("native_standard", 256, 10000.0),
    _summary_row("replayssm_spec", 256, 4000.0, measured=1.0, al=1.0, concurrency=121.0),
]


def test_summary_table_has_each_arm_and_the_issues_ratios_per_batch():
    text = summary_markdown(SUMMARY_ROWS)
    assert "## default mode, k = 3, AL 1 configured" in text and "## default mode, k = 3, AL 2.8 configured" in text
    assert text.index("AL 1 configured") < text.index("AL 2.8 configured")
    table = text.split("AL 2.8 configured")[1].split("Invalid rows")[0]
    b128 = next(line for line in table.splitlines() if line.startswith("| 128 |")).split(" | ")
    assert b128[1:5] == ["8,000 (10.00 ms)", "6,000 (40.00 ms, AL 2.81)", "9,000 (10.00 ms)",
                         "12,000 (window 12,500, 20.00 ms, AL 2.79)"]  # fmt: skip
    assert b128[5:8] == ["13,200 (18.00 ms, AL 2.80)", "12,600 (19.00 ms, AL 2.80)", "13,500 (17.50 ms, AL 2.80)"]
    assert b128[8] == "–", "the per-group control arm did not run"
    assert b128[9:15] == ["2.00×", "1.50×", "2.20×", "2.10×", "2.25×", "–"] and b128[15] == "40.0 → 121.0 (3.02×) |"
    b256 = next(line for line in table.splitlines() if line.startswith("| 256 |")).split(" | ")
    assert b256[2] == "5,000 (90.00 ms, AL 2.80) **invalid**" and b256[3] == "–"
    assert b256[5:15] == ["–", "–", "–", "–", "–", "1.50×", "–", "–", "–", "–"]  # no ratio against an invalid row
    assert b256[15] == "40.0 → 121.0 (3.02×) |"  # capacity still shown
    assert "- native_spec default, k 3, AL 2.8, batch 256: the batch did not run at once" in text
    al1 = text.split("AL 1 configured")[1].split("AL 2.8 configured")[0]
    assert ("| 256 | 10,000 (10.00 ms) | – | – | 4,000 (10.00 ms, AL 1.00) | – | – | – | – | – | 0.40× | – | – | – | – "
            "| – → 121.0 |") in al1  # fmt: skip


def test_summary_compares_each_spec_arm_at_the_largest_batch_it_ran():
    """Native spec holds 227 requests, ReplaySSM spec 655: a `fit` row each (224 and 640, the multiples of 32 they
    hold), compared beside the per-batch table; a batch a multiple of 32 or more below the capacity is not it."""
    rows = [*SUMMARY_ROWS[:4], _summary_row("native_spec", 224, 10700.0, measured=2.8, concurrency=227.4),
            _summary_row("replayssm_spec", 640, 16050.0, measured=2.8, concurrency=655.9)]  # fmt: skip
    text = summary_markdown(rows)
    assert ("Largest batch each ran, over native spec's: native spec batch 224 (its capacity): 10,700 tok/s; "
            "ReplaySSM spec batch 640 (its capacity): 16,050 tok/s, 1.50×.") in text  # fmt: skip
    longer = _summary_row("replayssm_spec_l28", 576, 17120.0, measured=2.8, concurrency=600.0)
    assert (
        "16,050 tok/s, 1.50×; ReplaySSM spec, L 28 batch 576 (its capacity): 17,120 tok/s, 1.60×."
        in summary_markdown([*rows, longer])
    ), "every ReplaySSM spec arm beside native spec's"
    rows[-1] = _summary_row("replayssm_spec", 600, 16050.0, measured=2.8, concurrency=655.9)
    assert "ReplaySSM spec batch 600: 16,050 tok/s" in summary_markdown(rows)
    rows[-2], rows[-1] = {**rows[-2], "date": "2026-12-04"}, {**rows[-1], "date": "2026-12-02"}  # another host
    assert "16,050 tok/s, 1.50× (another host)." in summary_markdown(rows)
    assert "Largest batch" not in summary_markdown(SUMMARY_ROWS[:4]), "same largest batch: the table says it"


def test_a_ratio_across_hosts_is_marked_and_explained():
    """Hosts told apart by their GPU's UUID where both rows carry one (every lent host's name is "vm"), else by date."""
    native, replay = SUMMARY_ROWS[1], SUMMARY_ROWS[3]  # native spec and ReplaySSM spec at 128, AL 2.8: 2.00×

    def ratio_cell(a: dict, b: dict) -> str:
        text = summary_markdown([a, b])
        line = next(line for line in text.splitlines() if line.startswith("| 128 |"))
        return line.split(" | ")[9]

    same_day = {"date": "2026-12-04"}
    assert ratio_cell(native | same_day, replay | same_day) == "2.00×"
    assert ratio_cell(native | {"date": "2026-12-03"}, replay | same_day) == "2.00×†", "no UUID: the dates differ"
    one, other = {**same_day, "gpu_uuid": "GPU-1"}, {**same_day, "gpu_uuid": "GPU-2"}
    assert ratio_cell(native | one, replay | other) == "2.00×†", "the same day, two GPUs"
    assert ratio_cell(native | one, replay | {**one, "date": "2026-12-05"}) == "2.00×", "one GPU past midnight"
    assert "† the two rows ran on different GPUs" in summary_markdown([native | one, replay | other])
    assert "†" not in summary_markdown([native | one, replay | one])


def test_the_summary_says_where_each_row_that_kept_its_conditions_ran():
    native = SUMMARY_ROWS[1] | {"gpu_uuid": "GPU-eaf3bfd1-ad3ad19",
                                "conditions": {"gpu_clock_share": 0.812, "host_probe_ms": 9.84}}  # fmt: skip
    replay = SUMMARY_ROWS[3] | {"conditions": {"gpu_clock_share": None, "host_probe_ms": 15.2}}
    text = summary_markdown([native, replay, SUMMARY_ROWS[0]])
    listed = text.split("Where the rows ran (the rows that keep their conditions):\n\n")[1].splitlines()
    assert listed == [
        "- native_spec default, k 3, AL 2.8, batch 128: GPU …ad3ad19, SM clock 0.81 of its maximum, host probe 9.8 ms",
        "- replayssm_spec default, k 3, AL 2.8, batch 128: GPU not named, host probe 15.2 ms",
    ]  # the standard row kept none: not listed
    assert "Where the rows ran" not in summary_markdown(SUMMARY_ROWS), "rows from before the conditions: no section"


def test_summarise_prints_the_file_and_refuses_an_empty_one(tmp_path, capsys):
    out = tmp_path / "spec.json"
    for row in SUMMARY_ROWS:
        record_row(out, row, WHAT, "cmd", {}, SPEC_KEY)
    assert main(["--summarise", str(out)]) == 0
    assert capsys.readouterr().out == summary_markdown(json.loads(out.read_text())["rows"])
    assert main(["--summarise", str(tmp_path / "none.json")]) == 2
    assert "holds no rows" in capsys.readouterr().out
    assert main(["--summarise", str(out), "--arm", "native_spec"]) == 2
    assert "takes no other option" in capsys.readouterr().out
