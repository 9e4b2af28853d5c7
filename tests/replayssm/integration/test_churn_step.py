"""churn_step.py's CPU parts: the first wave's staggered lengths, the window's split of mixed and decode-only
steps, the row and its problems, and bad arguments as one line. Its flow against vLLM's engine interface runs in
test_vllm_gpu_stages.py."""

from types import SimpleNamespace

import pytest

from replayssm_patch.gpu.churn_step import ChurnWindow, churn_window, first_wave_lengths, main, make_row
from replayssm_patch.gpu.decode_window import EngineStep


def test_first_wave_finishes_spread_evenly_up_to_the_output_length():
    assert first_wave_lengths(4, 8) == [2, 4, 6, 8]
    lengths = first_wave_lengths(64, 192)
    assert lengths[0] == 3 and lengths[-1] == 192 and lengths == sorted(lengths) and len(set(lengths)) == 64
    assert first_wave_lengths(8, 2)[0] == 1  # never a zero-token request


def _step(stamp_s, started=0, rows=4, tokens=4):
    return EngineStep(stamp_s=stamp_s, rows=rows, tokens=tokens, started=started, finished=0)


def test_each_period_belongs_to_the_later_step_and_is_split_by_its_prefill():
    steps = [_step(10.000), _step(10.005), _step(10.045, started=1), _step(10.050), _step(10.090, started=2)]
    window = churn_window(steps)
    assert window == ChurnWindow(steps=4, mean_ms=22.5, mixed_ms=40.0, decode_ms=5.0, mixed_share=0.5,
                                 tokens_per_s=round(16 / 0.090, 1), fewest_rows=4)  # fmt: skip


def test_a_window_needs_two_stamped_steps():
    assert churn_window([_step(1.0)]) is None
    assert churn_window([_step(1.0), _step(0.0)]) is None
    only_decode = churn_window([_step(1.0), _step(1.005)])
    assert only_decode is not None and only_decode.mixed_ms is None and only_decode.decode_ms == 5.0


def _window(mean_ms, fewest_rows=64):
    return ChurnWindow(steps=100, mean_ms=mean_ms, mixed_ms=mean_ms * 2, decode_ms=mean_ms / 2, mixed_share=0.25,
                       tokens_per_s=1000.0, fewest_rows=fewest_rows)  # fmt: skip


def test_row_holds_medians_and_spread_and_says_why_it_is_invalid():
    args = SimpleNamespace(variant="baseline", mode="default", prompt_tokens=1024, output_tokens=192)
    row = make_row(args, 64, [_window(10.0), _window(12.0), _window(11.0)], lost=0)
    assert (row["step_ms"], row["spread_ms"], row["mixed_step_ms"], row["decode_step_ms"]) == (11.0, 2.0, 22.0, 5.5)
    assert row["valid"] and row["problems"] == [] and row["steps"] == 100
    short = make_row(args, 64, [_window(10.0, fewest_rows=60), None], lost=2)
    assert not short["valid"]
    assert short["problems"] == [
        "1 repeat(s) without engine timestamps",
        "a measured step served only 60 of 64 requests: the KV cache ran short",
        "2 preemption(s)",
    ]


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
