"""churn_step.py's CPU parts: the first wave's staggered lengths, the window's split of mixed and decode-only
steps, the row and its problems, and bad arguments as one line. Its flow against vLLM's engine interface runs in
test_vllm_gpu_stages.py."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from replayssm_patch.gpu import churn_summary
from replayssm_patch.gpu.churn_step import ChurnWindow, churn_window, first_wave_lengths, main, make_row
from replayssm_patch.gpu.decode_window import EngineStep


def test_first_wave_finishes_spread_evenly_up_to_the_output_length():
    assert first_wave_lengths(4, 8) == [2, 4, 6, 8]
    lengths = first_wave_lengths(64, 192)
    assert lengths[0] == 3 and lengths[-1] == 192 and lengths == sorted(lengths) and len(set(lengths)) == 64
    assert first_wave_lengths(8, 2)[0] == 1  # never a zero-token request


def _step(stamp_s, started=0, rows=4, tokens=None):
    tokens = rows if tokens is None else tokens
    return EngineStep(stamp_s=stamp_s, rows=rows, tokens=tokens, started=started, finished=0)


def test_decode_periods_are_those_without_a_prefill_beside_them_and_mixed_steps_take_the_rest():
    """Async scheduling: a mixed step's launches land in the period before it (here 5 + 30 ms), its GPU work in its
    own (5 + 5 ms); the decode step is read from periods clear of both, the mixed step from the window's excess."""
    stamps_ms = [0, 5, 10, 45, 55, 60, 65, 100, 110]
    prefills = [0, 0, 0, 0, 1, 0, 0, 0, 1]
    steps = [_step(10 + ms / 1e3, started=p, rows=4 - p) for ms, p in zip(stamps_ms, prefills, strict=True)]
    window = churn_window(steps)
    # clean: steps 1, 2, 5, 6 (each and its successor decode-only) -> 5 ms; excess 110 - 8 * 5 = 70 over 2 mixed
    assert window == ChurnWindow(steps=8, mean_ms=13.75, mixed_ms=40.0, decode_ms=5.0, mixed_share=0.25,
                                 tokens_per_s=round(30 / 0.110, 1), mean_rows=3.75, fewest_rows=3)  # fmt: skip


def test_a_window_needs_two_stamped_steps():
    assert churn_window([_step(1.0)]) is None
    assert churn_window([_step(1.0), _step(0.0)]) is None
    two = churn_window([_step(1.0), _step(1.005), _step(1.010)])
    assert two is not None and two.mixed_ms is None and two.decode_ms == 5.0
    only_mixed = churn_window([_step(1.0), _step(1.040, started=1)])
    assert only_mixed is not None and only_mixed.decode_ms is None and only_mixed.mixed_ms is None


def _window(mean_ms):
    return ChurnWindow(steps=100, mean_ms=mean_ms, mixed_ms=mean_ms * 2, decode_ms=mean_ms / 2, mixed_share=0.25,
                       tokens_per_s=1000.0, mean_rows=63.5, fewest_rows=62)  # fmt: skip


def test_row_holds_medians_and_spread_and_says_why_it_is_invalid():
    args = SimpleNamespace(variant="baseline", mode="default", prompt_tokens=1024, output_tokens=192)
    row = make_row(args, 64, [_window(10.0), _window(12.0), _window(11.0)], lost=0)
    assert (row["step_ms"], row["spread_ms"], row["mixed_step_ms"], row["decode_step_ms"]) == (11.0, 2.0, 22.0, 5.5)
    assert row["valid"] and row["problems"] == [] and row["steps"] == 100 and row["mean_rows"] == 63.5
    assert row["last_over_first"] == 1.1  # 11 / 10: the engine's drift over the repeats
    short = make_row(args, 64, [_window(10.0), None], lost=2)
    assert not short["valid"] and short["last_over_first"] is None  # one repeat measured: no drift to read
    assert short["problems"] == ["1 repeat(s) without engine timestamps", "2 preemption(s): the KV cache ran short"]


@pytest.mark.parametrize("flag", ["--output-tokens", "--steps", "--repeats"])
def test_counts_below_one_are_refused_in_one_line(tmp_path, capsys, flag):
    (tmp_path / "config.json").write_text("{}")
    assert main(["--model", str(tmp_path), "--out", str(tmp_path / "o.json"), flag, "0"]) == 2
    assert capsys.readouterr().out.strip() == f"error: {flag} must be at least 1 (got 0)"


def test_an_out_file_that_is_not_a_results_file_is_refused_before_the_engine_starts(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "o.json").write_text("[1, 2]")
    assert main(["--model", str(tmp_path), "--out", str(tmp_path / "o.json")]) == 2
    out = capsys.readouterr().out.strip()
    assert out.startswith("error: ") and "not a results file" in out and out.count("\n") == 0


RESULTS = Path(__file__).parents[3] / "replayssm_patch" / "gpu" / "results" / "churn_step-h200-qwen3.5-4b-run1.json"


def test_summary_pairs_each_variant_with_the_baselines_same_repeat(capsys):
    """The H200 rows of session 12: ReplaySSM's k-th repeat over the baseline's k-th (the engine slows between
    repeats, so the rows' medians would mix the drift into the ratio)."""
    assert churn_summary.main([str(RESULTS)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| default | 64 | 1024 / 192 | replayssm_fp32 | 1 | 1.059 | 1.072 | 0.978 | 0.945 | — / — |"
    assert lines[3] == "| default | 64 | 1024 / 192 | replayssm_fp32 | 2 | 1.064 | 1.074 | 1.001 | 0.940 | — / — |"
    assert len(lines) == 4


def test_summary_shows_each_repeats_gpu_clock_share():
    rows = json.loads(RESULTS.read_text())["rows"]
    for row, share in zip(rows, (0.98, 0.71), strict=True):
        row["repeats"][0]["conditions"] = {"gpu_clock_share": share}
    assert "| 0.71 / 0.98 |" in churn_summary.paired_table(rows).splitlines()[2]


SESSION15 = [RESULTS.with_name(f"churn_step-h200-qwen3.5-4b-run{n}.json") for n in (4, 5)]


def test_summary_pools_mirrored_passes_over_every_repeat(capsys):
    """Session 15's two passes (baseline, one-launch, four-launch, per-group; then four-launch, one-launch,
    baseline): each arm's mean over all its repeats, and over the baseline's; the per-group arm ran once."""
    assert churn_summary.main([str(path) for path in SESSION15]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split(" | ")[3]: line for line in lines[2:]}
    assert set(rows) == {"baseline", "replayssm_fp32", "replayssm_fp32_four_launch_mixed", "replayssm_fp32_per_group"}
    assert rows["baseline"].endswith("| 4 | 29.26 (1.000) | 76.12 (1.000) | 6.21 (1.000) | 2198.20 (1.000) |")
    assert "| 4 | 27.74 (0.948) | 71.37 (0.938) |" in rows["replayssm_fp32"]
    assert "| 2 |" in rows["replayssm_fp32_per_group"]


@pytest.mark.parametrize(
    ("make_args", "needle"),
    [
        (lambda tmp: [], "give one churn_step results file"),
        (lambda tmp: [str(tmp / "absent.json")], "does not exist"),
        (lambda tmp: [str(RESULTS), str(tmp / "absent.json")], "does not exist"),
        (lambda tmp: [str(_rows_file(tmp, [{"variant": "replayssm_fp32"}]))], "holds no baseline row"),
        (lambda tmp: [str(_rows_file(tmp, None))], "not a results file"),
    ],
)
def test_summary_refuses_bad_input_in_one_line(tmp_path, capsys, make_args, needle):
    assert churn_summary.main(make_args(tmp_path)) == 2
    out = capsys.readouterr().out.strip()
    assert out.startswith("error: ") and needle in out and "\n" not in out


def _rows_file(tmp: Path, rows: list | None) -> Path:
    path = tmp / "rows.json"
    path.write_text(json.dumps({"rows": rows} if rows is not None else [1, 2]))
    return path
