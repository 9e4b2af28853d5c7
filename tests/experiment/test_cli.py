"""`replaybench check` and `replaybench run` as a user runs them: real processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from harness.records.result_io import read_results
from tests.conftest import stray_servers, wait_for_no_strays
from tests.experiment.support import config_dict, sim_command, tiny_trace, write_config

REPLAYBENCH = str(Path(sys.executable).with_name("replaybench"))


def replaybench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [REPLAYBENCH, *args], capture_output=True, text=True, timeout=timeout, env=os.environ | {"COLUMNS": "200"}
    )


def only_run_dir(output: Path) -> Path:
    (run,) = list(output.iterdir())
    return run


def test_check_shows_findings_and_warns_on_undeclared_difference(tmp_path: Path) -> None:
    document = config_dict(tiny_trace(tmp_path / "trace.parquet"))
    document["arms"]["candidate"]["command"] = sim_command("replayssm", "--max-num-seqs", "8")  # type: ignore[index]
    result = replaybench("check", str(write_config(tmp_path / "exp.toml", document)))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "ok   trace     trace.parquet: 6 requests" in out
    assert "no GPU: embedded engine only" in out or "GPU(s) visible" in out
    assert "WARN policy    arg --max-num-seqs differs (None vs '8') but is not in policy_change" in out
    assert "WARN quality   no [quality] table" in out
    assert "--policy" in out and "NOT declared" in out and "policy change" in out


def test_port_in_use_and_bad_key_stop_the_run_with_one_line(tmp_path: Path) -> None:
    trace = tiny_trace(tmp_path / "trace.parquet")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        document = config_dict(trace)
        document["arms"]["candidate"]["port"] = port  # type: ignore[index]
        result = replaybench(
            "run", "--config", str(write_config(tmp_path / "exp.toml", document)), "--output-dir", str(tmp_path / "out")
        )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: preflight check failed (1 problem(s)), first: port {port} is in use; stop what listens there "
        "or set arms.candidate.port = 0 (a free port)"
    ]
    assert not (tmp_path / "out").exists()  # nothing was created before the checks passed
    bad = config_dict(trace, repeat=3)
    result = replaybench("run", "--config", str(write_config(tmp_path / "bad.toml", bad)))
    assert result.returncode == 2 and "unknown key `repeat`" in result.stderr and "Traceback" not in result.stderr


def test_aa_run_with_quality_tasks_and_report(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "\n".join(
            json.dumps(t)
            for t in [
                {"task_id": "nonempty", "prompt": "Say hello.", "kind": "regex", "expected": r"\S", "max_tokens": 8},
                {"task_id": "impossible", "prompt": "2+2=", "kind": "numeric", "expected": "4.5", "max_tokens": 4},
            ]
        )
        + "\n"
    )
    document = config_dict(
        tiny_trace(tmp_path / "trace.parquet"), quality_tasks=str(tasks), quality={"max_pass_rate_drop": 0.0}
    )
    document["arms"]["candidate"] = "baseline"  # type: ignore[index]
    result = replaybench(
        "run",
        "--config",
        str(write_config(tmp_path / "aa.toml", document)),
        "--output-dir",
        str(tmp_path / "out"),
        "--save-outputs",
    )
    assert result.returncode == 0, result.stderr
    run = only_run_dir(tmp_path / "out")
    assert f"report: {run / 'index.html'}" in result.stdout.replace("\n", "")
    assert "A/A run" in result.stdout
    for name in (
        "experiment.toml",
        "env.json",
        "attempts.json",
        "quality.json",
        "index.html",
        "summary.json",
        "decision.json",
        "summary.md",
        "junit.xml",
    ):
        assert (run / name).is_file(), name
    assert tomllib.loads((run / "experiment.toml").read_text())["mode"] == "A/A"
    assert json.loads((run / "env.json").read_text())["mode"] == "A/A"
    quality = json.loads((run / "quality.json").read_text())
    by_id = {t["task_id"]: t for t in quality["tasks"]}
    assert by_id["nonempty"]["baseline"]["passed"] and by_id["nonempty"]["candidate"]["passed"]
    assert not by_id["impossible"]["baseline"]["passed"]
    assert all(t["identical"] and t["first_divergent_token"] is None for t in quality["tasks"])
    outputs = read_results(run / "results" / "candidate-r0.parquet")[0].column("output_text").to_pylist()
    assert all(outputs), "--save-outputs keeps every generated text"
    decision = json.loads((run / "decision.json").read_text())
    assert decision["outcome"] in result.stdout


def _start_run(tmp_path: Path, repeats: int) -> tuple[subprocess.Popen[str], Path]:
    trace = tiny_trace(tmp_path / "trace.parquet", requests=12, spacing_s=0.1)
    config = write_config(tmp_path / "exp.toml", config_dict(trace, repeats=repeats))
    process = subprocess.Popen(
        [REPLAYBENCH, "run", "--config", str(config), "--output-dir", str(tmp_path / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    return process, tmp_path / "out"


def _wait_for(condition, process: subprocess.Popen[str], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert process.poll() is None, "replaybench ended before the test could interrupt it"
        assert time.monotonic() < deadline, "timed out waiting for the run to get there"
        time.sleep(0.1)


def _final_attempts(output: Path) -> list[dict[str, object]]:
    try:
        log = json.loads(next(output.glob("*/attempts.json")).read_text())
    except (StopIteration, ValueError, OSError):
        return []
    return [a for a in log if a["final"]]


def test_ctrl_c_then_resume_continues_from_the_last_complete_repeat(tmp_path: Path) -> None:
    process, output = _start_run(tmp_path, repeats=2)
    try:
        _wait_for(lambda: len(_final_attempts(output)) >= 2 and stray_servers(), process)
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
        text, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, text
    assert stray_servers() == {}
    run = only_run_dir(output)
    assert f"replaybench run --resume {run}" in text.replace("\n", "")
    before = json.loads((run / "attempts.json").read_text())
    result = replaybench("run", "--resume", str(run))
    assert result.returncode == 0, result.stdout + result.stderr
    log = json.loads((run / "attempts.json").read_text())
    assert log[: len(before)][:2] == before[:2]  # repeat 0 untouched
    finals = sorted((a["arm"], a["repeat"]) for a in log if a["final"])
    assert finals == [("baseline", 0), ("baseline", 1), ("candidate", 0), ("candidate", 1)]
    assert [a["attempt"] for a in log if a["repeat"] == 0] == [1, 1]
    assert sorted(p.name for p in (run / "results").iterdir()) == [
        "baseline-r0.parquet",
        "baseline-r1.parquet",
        "candidate-r0.parquet",
        "candidate-r1.parquet",
    ]
    assert (run / "index.html").is_file()


def test_sigterm_of_replaybench_leaves_no_server(tmp_path: Path) -> None:
    process, _ = _start_run(tmp_path, repeats=3)
    try:
        _wait_for(lambda: bool(stray_servers()), process)
        process.send_signal(signal.SIGTERM)  # only replaybench itself, as a supervisor would
        process.wait(timeout=60)
    finally:
        process.kill()
        process.communicate()
    assert process.returncode in (130, 143) and stray_servers() == {}


def test_sigkill_mid_replay_leaves_no_server_and_resume_lists_the_lost_attempt(tmp_path: Path) -> None:
    process, output = _start_run(tmp_path, repeats=1)
    try:
        _wait_for(lambda: any(output.glob("*/attempts/*.partial")), process)
        process.kill()  # nothing in replaybench runs after SIGKILL: the watchdog and PDEATHSIG stop the server
        process.wait(timeout=60)
    finally:
        process.kill()
        process.communicate()
    assert wait_for_no_strays(15.0) == {}
    run = only_run_dir(output)
    result = replaybench("run", "--resume", str(run))
    assert result.returncode == 0, result.stdout + result.stderr
    log = json.loads((run / "attempts.json").read_text())
    lost = [a for a in log if "replaybench died during this attempt" in a["reason"]]
    assert len(lost) == 1 and lost[0]["attempt"] == 1 and str(lost[0]["path"]).endswith("-a1.parquet.partial")
    assert sorted((a["arm"], a["repeat"]) for a in log if a["final"]) == [("baseline", 0), ("candidate", 0)]
