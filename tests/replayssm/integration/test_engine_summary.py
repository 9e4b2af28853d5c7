"""engine_summary: issue 15's table of each variant's engine step over the baseline's, with load, clocks, targets."""

import json
from pathlib import Path

import pytest

from replayssm_patch.gpu import engine_summary
from replayssm_patch.gpu.engine_step import WHAT
from replayssm_patch.gpu.pooled_rows import pool_rows

H100 = Path(__file__).parents[3] / "replayssm_patch" / "gpu" / "results" / "engine_step-h100.json"


def _lines_by_variant(out: str) -> dict[tuple[str, int, str], str]:
    table = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| mode")]
    return {(cells[0], int(cells[1]), cells[2]): line for line in table if (cells := line[2:].split(" | "))}


def test_session_33s_h100_rows_meet_the_step_targets_at_256(capsys):
    """The committed H100 rows: split 31.36 / 17.22 ms = 1.82× by the window, its slowest repeat (18.38 ms) against
    the baseline's fastest (30.94) 1.68×, batch 256 at 103 % of the split arm's maximum concurrency (249.75)."""
    assert engine_summary.main([str(H100)]) == 0
    lines = _lines_by_variant(capsys.readouterr().out)
    assert len(lines) == 8  # two variants x two batches x two modes
    split = lines[("default", 256, "replayssm_split")]
    assert "| 17.22 (1.33) | 1.82× | 1.80× | 1.68× | 103% / 65% | 1,562 / 1,664 | ≥ 1.50×: met |" in split
    assert lines[("default", 256, "replayssm_fp32")].endswith(
        "| 1.42× | 1.42× | 1.38× | 70% / 65% | 1,599 / 1,664 | ≥ 1.30×: met |"
    )
    assert lines[("O0", 256, "replayssm_split")].endswith("| 103% / 66% | 1,619 / 1,683 |  |")  # no target in -O0


def _row(variant: str, batch: int, window: float | None, step: float, **extra) -> dict:
    repeats = [{"step_ms": step, "window": None if window is None else {"mean_ms": window}}]
    return {"variant": variant, "mode": "default", "batch": batch, "step_ms": step, "spread_ms": 0.1,
            "window_step_ms": window, "window_spread_ms": 0.0 if window else None, "repeats": repeats,
            "valid": True, "gpu_uuid": "GPU-a", "max_concurrency": 512.0} | extra  # fmt: skip


def test_a_miss_a_step_only_row_another_host_and_left_out_rows_are_said():
    rows = [
        _row("baseline", 256, 23.0, 23.2), _row("replayssm_fp32", 256, 20.0, 20.1),
        _row("baseline", 8, None, 5.0), _row("replayssm_split", 8, None, 5.2, gpu_uuid="GPU-b"),
        _row("replayssm_split", 256, 15.0, 15.0, valid=False, problems=["2 preemptions"]),
        _row("replayssm_fp32", 128, 11.0, 11.0),
    ]  # fmt: skip
    out = engine_summary.summary_markdown(rows, engine_summary.ISSUE_15)
    lines = _lines_by_variant(out)
    assert lines[("default", 256, "replayssm_fp32")].endswith(
        "| 1.15× | 1.15× | 1.15× | 50% / 50% | – / – | ≥ 1.30×: NOT met |"
    )
    # no window: the step stands in; another GPU: marked, and the note says why
    assert lines[("default", 8, "replayssm_split")].startswith(
        "| default | 8 | replayssm_split | 5.20 (0.10) | 0.96×† |"
    )
    assert lines[("default", 8, "replayssm_split")].endswith("| ≥ 0.98×: NOT met |")
    assert "ran on different GPUs" in out
    assert "- replayssm_split default, batch 256: 2 preemptions" in out
    assert "- replayssm_fp32 default, batch 128: no valid baseline row to pair" in out


@pytest.mark.parametrize(
    ("name", "issue"),
    [("engine_step-h200.json", 15), ("engine_step-h100.json", 15), ("engine_step-h200-qwen3.5-4b.json", 16),
     ("engine_step-h100-floor.json", None), ("engine_step-h200-qwen3.5-35b-a3b.json", None), ("rows.json", 15)],
)  # fmt: skip
def test_the_files_name_says_which_issue_its_rows_answer(name, issue):
    targets = engine_summary.targets_of(Path(name))
    assert (targets and targets.issue) == issue


def test_gdn_rows_are_held_to_issue_16s_targets(capsys):
    """The committed qwen3.5-4b rows (session 9-16): 1.00× at 256 against issue 16's 1.25×, batches to 32 held to
    0.98×, and 64 (beyond issue 16's small batches) to nothing."""
    qwen = H100.with_name("engine_step-h200-qwen3.5-4b.json")
    assert engine_summary.main([str(qwen)]) == 0
    out = capsys.readouterr().out
    lines = _lines_by_variant(out)
    assert "| issue 16 target |" in out
    assert lines[("default", 256, "replayssm_fp32")].endswith("| ≥ 1.25×: NOT met |")
    assert lines[("default", 32, "replayssm_fp32")].endswith(": met |")
    assert lines[("default", 64, "replayssm_fp32")].endswith("|  |")


@pytest.mark.parametrize(
    ("make_args", "needle"),
    [
        (lambda tmp: [], "give one engine_step results file"),
        (lambda tmp: [str(tmp / "absent.json")], "does not exist"),
        (
            lambda tmp: [str(_file(tmp, {"what": WHAT, "rows": [_row("replayssm_fp32", 64, 9.0, 9.0)]}))],
            "holds no baseline row",
        ),
        (lambda tmp: [str(_file(tmp, [1, 2]))], "not a results file"),
    ],
)
def test_bad_input_gets_one_error_line(tmp_path, capsys, make_args, needle):
    assert engine_summary.main(make_args(tmp_path)) == 2
    out = capsys.readouterr().out.strip()
    assert out.startswith("error: ") and needle in out and "\n" not in out


def _file(tmp: Path, payload) -> Path:
    path = tmp / "engine_step.json"
    path.write_text(json.dumps(payload))
    return path


H200 = H100.with_name("engine_step-h200.json")


def test_session_34s_two_runs_on_one_h200_are_pooled_from_the_history(capsys):
    """The file keeps the second run of each arm at 256 (split 15.67 ms, 1.44×); --pool takes both runs' ten
    repeats from the history beside it: split 15.24 ms (median of ten), 1.45×, fp32 17.90 ms, 1.24×."""
    assert engine_summary.main([str(H200)]) == 0
    alone = _lines_by_variant(capsys.readouterr().out)
    assert "| 15.67 (5.75) | 1.44× |" in alone[("default", 256, "replayssm_split")]
    assert engine_summary.main([str(H200), "--pool"]) == 0
    pooled = _lines_by_variant(capsys.readouterr().out)
    assert "| 15.24 (5.83; 2 runs) | 1.45× |" in pooled[("default", 256, "replayssm_split")]
    assert "| 17.90 (4.81; 2 runs) | 1.24× |" in pooled[("default", 256, "replayssm_fp32")]
    assert pooled[("default", 256, "replayssm_split")].endswith("| ≥ 1.50×: NOT met |")
    assert pooled[("default", 64, "replayssm_split")] == alone[("default", 64, "replayssm_split")]  # one run


def test_only_runs_on_one_named_gpu_on_one_day_pool():
    first = _row("replayssm_fp32", 256, 20.0, 20.0, date="2026-12-05", conditions={"gpu_sm_mhz_mean": 1600.0})
    second = _row("replayssm_fp32", 256, 18.0, 18.0, date="2026-12-05", valid=False, problems=["1 preemption"],
                  conditions={"gpu_sm_mhz_mean": 1700.0})  # fmt: skip
    other_day = _row("replayssm_fp32", 256, 10.0, 10.0, date="2026-12-04")
    pooled = pool_rows([second], [other_day, first, second])[0]
    assert pooled["runs"] == 2 and len(pooled["repeats"]) == 2
    assert pooled["window_step_ms"] == 19.0 and pooled["window_spread_ms"] == 2.0 and pooled["step_ms"] == 19.0
    assert pooled["valid"] is False and pooled["problems"] == ["1 preemption"]
    assert pooled["conditions"]["gpu_sm_mhz_mean"] == 1650.0
    unnamed = [first | {"gpu_uuid": None}, second | {"gpu_uuid": None}]
    assert pool_rows(unnamed[1:], unnamed) == unnamed[1:]  # nothing says they shared a host


def test_a_broken_history_line_is_one_error_line(tmp_path, capsys):
    path = _file(tmp_path, {"what": WHAT, "rows": [_row("baseline", 64, 9.0, 9.0)]})
    path.with_name("engine_step.history.jsonl").write_text('{"variant": "baseline"}\n{"variant": \n')
    assert engine_summary.main([str(path), "--pool"]) == 2
    out = capsys.readouterr().out.strip()
    assert out.startswith("error: ") and "line 2 is not JSON" in out and "\n" not in out


def test_the_host_floor_beside_the_file_says_which_steps_sit_in_it(capsys):
    """Session 34's H200 floor at 256, both runs pooled: 18.02 ms, repeats 14.99-22.83, against the baseline's
    22.17; both candidates (17.90, 15.24 ms) lie within it. The rows at 1 and 8 come from another day: marked."""
    assert engine_summary.main([str(H200), "--pool"]) == 0
    out = capsys.readouterr().out
    assert "- default, batch 256: host floor 18.02 ms (repeats 14.99-22.83), the baseline 22.17 ms; within its " \
           "range: replayssm_fp32 17.90 ms, replayssm_split 15.24 ms (there the step is near vLLM's own host " \
           "work)" in out  # fmt: skip
    assert "- default, batch 1: host floor 3.91 ms† (repeats 2.78-3.97), the baseline 4.64 ms; every variant " \
           "above its range" in out  # fmt: skip


def test_a_floor_row_without_a_baseline_of_its_batch_is_left_out():
    rows = [_row("baseline", 256, 31.0, 31.0), _row("replayssm_split", 256, 21.0, 21.0)]
    floor = [_row("baseline", 256, 19.0, 19.0), _row("baseline", 64, 5.0, 5.0)]
    out = engine_summary.summary_markdown(rows, engine_summary.ISSUE_15, floor)
    assert "batch 64" not in out
    assert "- default, batch 256: host floor 19.00 ms (repeats 19.00-19.00), the baseline 31.00 ms; every variant " \
           "above its range" in out  # fmt: skip
