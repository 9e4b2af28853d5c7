"""Everything a run directory holds besides the per-request results, read defensively.

A missing or broken side file (experiment.toml, env.json, attempts.json, capacity.json) becomes a note in the
report rather than a crash; only a directory without any result file is unusable (`UnusableRunDir`).
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from harness.analysis.model import Attempt, CapacityEntry
from harness.errors import UserError
from harness.records.decision_config import AnalysisConfig, analysis_config_from_mapping
from harness.records.run_dir import RunDir

ARMS = ("baseline", "candidate")
RESULT_NAME = re.compile(r"^(?P<arm>baseline|candidate)-r(?P<repeat>\d+)\.parquet$")


class UnusableRunDir(UserError):
    """The directory cannot be analysed at all (missing, not a run directory, or without results)."""


def final_attempt(attempts: list[Attempt], arm: str, repeat: int) -> Attempt | None:
    """The attempt that stands for (arm, repeat): the one marked final, else the latest one."""
    mine = [a for a in attempts if a.arm == arm and a.repeat == repeat]
    marked = [a for a in mine if a.final]
    return (marked or sorted(mine, key=lambda a: a.attempt) or [None])[-1]


@dataclass
class RunInputs:
    run: RunDir
    config: AnalysisConfig
    declared: bool  # the decision rule came from a readable experiment.toml
    experiment: str
    mode: str | None  # "A/A" or "A/B" as the experiment layer derived it
    environment: dict[str, object]
    attempts: list[Attempt]
    results: dict[tuple[str, int], Path]
    capacity: dict[str, CapacityEntry]
    notes: list[str] = field(default_factory=list)
    commands: dict[str, list[str]] = field(default_factory=dict)  # arm -> server command line as declared
    restarted: bool | None = None  # restart_per_repeat as declared (None: no readable experiment.toml says)


def _json(path: Path, notes: list[str], what: str) -> object | None:
    if not path.exists():
        notes.append(f"no {path.name}: {what} not shown")
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        notes.append(f"{path.name} is unreadable ({error}); {what} not shown")
        return None


def _config(run: RunDir, notes: list[str]) -> tuple[AnalysisConfig, bool, str, str | None, dict[str, object]]:
    """(config, declared, experiment name, mode, the whole document); defaults and a note when
    experiment.toml is unusable."""
    path = run.experiment_toml
    if not path.exists():
        notes.append("no experiment.toml: analysed with default SLOs and decision rule, so no decision is made")
        return AnalysisConfig(), False, run.root.name, None, {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        config = analysis_config_from_mapping(data, path.name)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, UserError) as error:
        notes.append(f"experiment.toml is unusable ({error}); analysed with defaults, so no decision is made")
        return AnalysisConfig(), False, run.root.name, None, {}
    mode = data.get("mode")
    return config, True, str(data.get("name") or run.root.name), str(mode) if mode else None, data


def _commands(document: dict[str, object]) -> dict[str, list[str]]:
    """Each arm's `command` from the frozen config's `[arms]` table (the analysis reads it, never runs it)."""
    arms = document.get("arms")
    commands = {}
    for arm in ARMS:
        entry = arms.get(arm) if isinstance(arms, dict) else None
        command = entry.get("command") if isinstance(entry, dict) else None
        if isinstance(command, list) and all(isinstance(word, str) for word in command):
            commands[arm] = command
    return commands


def _attempts(run: RunDir, notes: list[str]) -> list[Attempt]:
    data = _json(run.attempts_json, notes, "retried/crashed attempts")
    if data is None:
        return []
    try:
        return [Attempt.model_validate(item) for item in data]
    except (TypeError, ValidationError) as error:
        notes.append(f"attempts.json does not list attempts ({str(error).splitlines()[0]}); attempts not shown")
        return []


def _capacity(run: RunDir, notes: list[str]) -> dict[str, CapacityEntry]:
    path = run.root / "capacity.json"
    if not path.exists():
        return {}
    data = _json(path, notes, "capacity")
    try:
        return {str(arm): CapacityEntry.model_validate(entry) for arm, entry in dict(data or {}).items()}
    except (TypeError, ValueError, ValidationError):
        notes.append("capacity.json is not {arm: {max_time_compression, cost_per_success_at_capacity}}; not shown")
        return {}


def read_inputs(root: Path) -> RunInputs:
    """Locate results and side files; raise `UnusableRunDir` only when there is nothing to analyse."""
    run = RunDir(Path(root))
    if not run.root.is_dir():
        raise UnusableRunDir(f"{run.root}: no such run directory; pass the directory `replaybench run` wrote")
    results: dict[tuple[str, int], Path] = {}
    notes: list[str] = []
    for path in sorted(run.results_dir.glob("*.parquet")) if run.results_dir.is_dir() else []:
        match = RESULT_NAME.match(path.name)
        if match:
            results[(match["arm"], int(match["repeat"]))] = path
        else:
            notes.append(f"results/{path.name} ignored: result files are named <baseline|candidate>-r<k>.parquet")
    if not results:
        raise UnusableRunDir(
            f"{run.root}: no result files in results/; not a run directory, or the run "
            "never finished a repeat — re-run `replaybench run`"
        )
    config, declared, experiment, mode, document = _config(run, notes)
    environment = _json(run.env_json, notes, "environment")
    return RunInputs(
        run=run,
        config=config,
        declared=declared,
        experiment=experiment,
        mode=mode,
        environment=environment if isinstance(environment, dict) else {},
        attempts=_attempts(run, notes),
        results=results,
        capacity=_capacity(run, notes),
        notes=notes,
        commands=_commands(document),
        restarted=restart if isinstance(restart := document.get("restart_per_repeat"), bool) else None,
    )
