"""Creating a run directory and freezing the resolved config into it before anything is sent."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import tomli_w

from harness.atomic import atomic_path
from harness.errors import UserError
from harness.experiment.config import ExperimentConfig, load_config
from harness.records.run_dir import RunDir


def new_run_dir(output_dir: Path, name: str) -> RunDir:
    """`<output_dir>/<name>-<UTC time>`, never an existing directory."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    root = output_dir / f"{name}-{stamp}"
    suffix = 1
    while root.exists():
        suffix += 1
        root = output_dir / f"{name}-{stamp}-{suffix}"
    try:
        root.mkdir(parents=True)
    except OSError as error:
        raise UserError(
            f"cannot create the run directory {root} ({error.strerror}); choose a writable --output-dir"
        ) from None
    return RunDir(root)


def freeze_config(config: ExperimentConfig, run: RunDir) -> None:
    """Write the resolved config (absolute paths, concrete ports, derived mode) as experiment.toml."""
    document = config.model_dump(mode="json", exclude_none=True)
    header = (
        f"# Frozen by replaybench before the first request: the {config.mode} experiment as it ran.\n"
        f"# `replaybench run --resume {run.root}` continues it with exactly these settings.\n"
    )
    with atomic_path(run.experiment_toml) as tmp:
        tmp.write_text(header + tomli_w.dumps(document))


def load_frozen(root: Path) -> tuple[ExperimentConfig, RunDir]:
    """The config of an existing run directory, for --resume."""
    run = RunDir(Path(root))
    if not run.experiment_toml.exists():
        raise UserError(f"{root}: no experiment.toml; --resume needs a directory written by `replaybench run`")
    return load_config(run.experiment_toml), run
