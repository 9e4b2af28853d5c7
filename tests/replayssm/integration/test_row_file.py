"""row_file: a rerun's row replaces the first in the results file, and the history keeps both."""

import json

from replayssm_patch.gpu.row_file import history_path, record_row

KEY = ("arm", "batch")


def test_a_replaced_row_stays_in_the_history_in_the_order_measured(tmp_path):
    out = tmp_path / "spec_step-h200.json"
    record_row(out, {"arm": "native_spec", "batch": 128, "step_ms": 33.26}, "what", "first call", {}, KEY)
    record_row(out, {"arm": "replayssm_spec", "batch": 128, "step_ms": 23.11}, "what", "first call", {}, KEY)
    record_row(out, {"arm": "replayssm_spec", "batch": 128, "step_ms": 21.20}, "what", "second call", {}, KEY)
    rows = json.loads(out.read_text())["rows"]
    assert [(r["arm"], r["step_ms"]) for r in rows] == [("native_spec", 33.26), ("replayssm_spec", 21.20)]
    assert history_path(out) == tmp_path / "spec_step-h200.history.jsonl"
    kept = [json.loads(line) for line in history_path(out).read_text().splitlines()]
    assert [(r["arm"], r["step_ms"], r["command"]) for r in kept] == [
        ("native_spec", 33.26, "first call"), ("replayssm_spec", 23.11, "first call"),
        ("replayssm_spec", 21.20, "second call"),
    ]  # fmt: skip
