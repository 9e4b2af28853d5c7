"""Load as a share of the baseline's capacity: `[trace] load = 0.65` becomes a time scale, once, before the run.

Effects depend on load (near capacity a 1 % slower step moves TPOT p50 by ~6 %; at 65 % by ~2 %), so a run
states where it ran: the baseline's capacity on the configured trace slice and SLO comes from a capacity.json
(`replaybench capacity`), and `time_scale = capacity's time scale / load` is frozen into experiment.toml with
the basis it came from, so `--resume` and every report use the same number.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.errors import UserError
from harness.experiment.capacity import SearchBounds
from harness.experiment.config import ExperimentConfig, LoadBasis, load_config

# The quick probe `run` does when no capacity.json is given: one replay per probe, from the recorded rate
# (time scale 1) up to 100x compression, to within 5 %.
PROBE_BOUNDS = SearchBounds(min_scale=0.01, max_scale=1.0, tolerance=0.05)
RERUN = (
    "re-run `replaybench capacity` with a {bound} (or --expand 2, which steps past it) and give its run directory as "
    "[trace] capacity"
)
PROBE_REPEATS = 1
BASELINE = "baseline"
TRACE_KEYS = ("path", "start_s", "duration_s", "limit")  # a capacity holds only for the slice it was measured on
SERVER_KEYS = ("command", "env", "model", "api")  # ... and for the same baseline server


def capacity_file(path: Path) -> Path:
    """A capacity.json, given itself or the run directory that holds it."""
    return path / "capacity.json" if path.is_dir() else path


def baseline_time_scale(document: object, source: str) -> float:
    """The baseline's time scale at capacity from a capacity.json document; an open-ended search is refused.

    Each refusal says how to search wider; a slice too small to load the baseline needs a longer one too.
    """
    entry = document.get(BASELINE) if isinstance(document, dict) else None
    if not isinstance(entry, dict):
        raise UserError(f"{source}: no baseline entry; run `replaybench capacity --config CONFIG` for this experiment")
    limit, scale = entry.get("limit"), entry.get("time_scale_at_capacity")
    if limit == "at_least":
        raise UserError(
            f"{source}: the baseline held its SLO even at the heaviest load probed, so its capacity is unknown "
            f"(is the slice long enough to load it?); {RERUN.format(bound='lower --min-scale')}"
        )
    if limit == "below_range" or not isinstance(scale, int | float) or scale <= 0:
        raise UserError(
            f"{source}: the baseline has no capacity on this slice (it missed its SLO even at the lightest load "
            f"probed); relax [slo], or {RERUN.format(bound='higher --max-scale')}"
        )
    return float(scale)


def _mismatches(config: ExperimentConfig, measured: ExperimentConfig) -> list[str]:
    """What differs between this experiment and the one the capacity was measured for (trace slice, SLO, baseline)."""
    ours, theirs = config.trace, measured.trace
    mine, other = config.arm(BASELINE), measured.arm(BASELINE)
    found = [f"trace.{key}" for key in TRACE_KEYS if getattr(ours, key) != getattr(theirs, key)]
    found += ["[slo]"] if config.slo != measured.slo else []
    found += [f"arms.baseline.{key}" for key in SERVER_KEYS if getattr(mine, key) != getattr(other, key)]
    return found


def read_capacity(path: Path, config: ExperimentConfig) -> float:
    """The baseline's time scale at capacity from a capacity.json, checked against this experiment.

    The experiment.toml beside the capacity.json says what was measured; a different trace slice, SLO or
    baseline server is refused (its capacity says nothing about this run's load).
    """
    file = capacity_file(path)
    try:
        document = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(
            f"trace.capacity: {file} does not exist; give a capacity.json or the run directory of "
            "`replaybench capacity`, or remove trace.capacity to probe the baseline first"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(f"trace.capacity: {file} is not a readable capacity.json ({error}); re-run capacity") from None
    beside = file.parent / "experiment.toml"
    if not beside.exists():
        raise UserError(
            f"trace.capacity: no experiment.toml beside {file}, so it cannot be matched to this trace slice and "
            "SLO; give the run directory `replaybench capacity` wrote"
        )
    differ = _mismatches(config, load_config(beside))
    if differ:
        raise UserError(
            f"trace.capacity: {file} was measured with a different {', '.join(differ)}; re-run "
            "`replaybench capacity --config` with this experiment, or remove trace.capacity to probe first"
        )
    return baseline_time_scale(document, str(file))


def with_load(config: ExperimentConfig, capacity_time_scale: float, source: str) -> ExperimentConfig:
    """The config with `load` turned into its time scale and the basis recorded (to be frozen)."""
    load = config.trace.load
    assert load is not None
    basis = LoadBasis(capacity_time_scale=capacity_time_scale, capacity_source=source)
    trace = config.trace.model_copy(update={"time_scale": capacity_time_scale / load, "load_basis": basis})
    return config.model_copy(update={"trace": trace})


def virtual_probe_problem(config: ExperimentConfig) -> str | None:
    """Why `capacity_probe = "virtual"` cannot serve this experiment, or None: it simulates the baseline's own
    embedded engine, and a real server's capacity must be measured."""
    from harness.experiment.settings_diff import embedded_engine_args

    if config.trace.capacity_probe != "virtual" or config.trace.load_resolved:
        return None
    if embedded_engine_args(config.arm(BASELINE).command or []) is not None:
        return None
    return (
        '[trace] capacity_probe = "virtual" simulates an embedded-engine baseline (serve-sim), and this baseline is '
        "another server, whose capacity must be measured: remove capacity_probe (or run `replaybench capacity`)"
    )


def describe_load(config: ExperimentConfig) -> str:
    """One line: the load as a share of capacity, or why it is not known."""
    trace = config.trace
    if trace.load is None:
        return f"time scale {trace.time_scale:g}; load relative to capacity not known (set [trace] load = 0.65)"
    if trace.load_basis is None:
        how = "simulated in virtual time" if trace.capacity_probe == "virtual" else "known"
        return f"load {trace.load:.0%} of the baseline's capacity (time scale set once the capacity is {how})"
    return (
        f"load {trace.load:.0%} of the baseline's capacity: time scale {trace.time_scale:.4g} "
        f"(capacity at {trace.load_basis.capacity_time_scale:.4g}, from {trace.load_basis.capacity_source})"
    )
