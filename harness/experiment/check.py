"""`replaybench check CONFIG`: everything that can be known before a run, checked before a run.

Each finding is "ok", "warn" (the run may go ahead, but read this) or "fail" (`run` refuses to start).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from harness.analysis.tail_samples import tail_quantiles, thin_tail_text
from harness.errors import UserError
from harness.experiment.arm_server import ArmServer, server_spec
from harness.experiment.config import ARMS, ArmConfig, ExperimentConfig
from harness.experiment.energy_counter import EnergyCounters
from harness.experiment.gpus import GpuInfo, query_gpus
from harness.experiment.load import capacity_file, describe_load, read_capacity, virtual_probe_problem, with_load
from harness.experiment.placement import placement_policy
from harness.experiment.quality import load_tasks
from harness.experiment.settings_diff import PROGRAM, arm_differences, embedded_engine_args, parse_command
from harness.servers import port_in_use, probe, server_identity
from harness.servers.process import resolve_executable

Level = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Finding:
    level: Level
    topic: str
    message: str


def _trace(config: ExperimentConfig) -> list[Finding]:
    from harness.experiment.runner import load_trace

    try:
        trace = load_trace(config)
    except UserError as error:
        return [Finding("fail", "trace", str(error))]
    rate = ""
    if config.trace.load_resolved:  # otherwise the time scale waits for the baseline's capacity
        span = trace.duration_s * config.trace.time_scale
        rate = f" over {span:.1f} s" + (f", {len(trace) / span:.2f} req/s offered" if span > 0 else "")
    tails = [
        Finding("warn", "decision", text)
        for metric, role, quantile in tail_quantiles(config.decision)
        if (text := thin_tail_text(metric, role, quantile, len(trace), "requests a run (the trace slice)"))
    ]
    return [Finding("ok", "trace", f"{config.trace.path.name}: {len(trace)} requests{rate}"), _load(config), *tails]


def _load(config: ExperimentConfig) -> Finding:
    """The load as a share of capacity; a given capacity.json is read (and matched to this experiment) now."""
    capacity = config.trace.capacity
    problem = virtual_probe_problem(config)
    if problem:
        return Finding("fail", "load", problem)
    if capacity is None or config.trace.load_resolved:
        return Finding("ok", "load", describe_load(config))
    try:
        scale = read_capacity(capacity, config)
    except UserError as error:
        return Finding("fail", "load", str(error))
    return Finding("ok", "load", describe_load(with_load(config, scale, str(capacity_file(capacity)))))


def _quality(config: ExperimentConfig) -> list[Finding]:
    if config.quality_tasks is None:
        return [
            Finding(
                "warn" if config.quality.required else "ok", "quality", "no quality_tasks file: quality is not measured"
            )
        ]
    try:
        tasks = load_tasks(config.quality_tasks)
    except UserError as error:
        return [Finding("fail", "quality", str(error))]
    return [Finding("ok", "quality", f"{len(tasks)} quality task(s) in {config.quality_tasks.name}")]


def _launch(label: str, arm: ArmConfig) -> list[Finding]:
    spec = server_spec(label, arm)
    found = []
    if resolve_executable(spec.argv[0], spec.cwd) is None:
        found.append(
            Finding("fail", label, f"command {spec.argv[0]!r} not found; install it or fix arms.{label}.command")
        )
    else:
        found.append(Finding("ok", label, f"command {spec.argv[0]!r} found"))
    if arm.port and port_in_use(arm.port):
        found.append(
            Finding(
                "fail",
                label,
                f"port {arm.port} is in use; stop what listens there or set arms.{label}.port = 0 (a free port)",
            )
        )
    if arm.version or arm.plugin:
        found.append(Finding("ok", label, "declared version/plugin are verified once the server is up"))
    return found


def _attached(label: str, arm: ArmConfig) -> list[Finding]:
    server = ArmServer(label, arm)
    if probe(server.ready_url) != 200:
        return [
            Finding("fail", label, f"nothing ready at {server.ready_url}; start that server or fix arms.{label}.url")
        ]
    found = [Finding("ok", label, f"ready at {server.ready_url}")]
    try:
        server.verify(server_identity(server.base_url))
    except UserError as error:
        found.append(Finding("fail", label, str(error)))
    if arm.plugin and arm.log is None:
        found.append(
            Finding(
                "warn", label, f"plugin {arm.plugin!r} cannot be verified without the server log; set arms.{label}.log"
            )
        )
    return found


def _ports(config: ExperimentConfig) -> list[Finding]:
    base, cand = config.arm("baseline"), config.arm("candidate")
    if config.order == "simultaneous" and base.launched and cand.launched and base.port and base.port == cand.port:
        return [
            Finding(
                "fail",
                "ports",
                f"both arms use port {base.port} but run simultaneously; give the "
                "candidate its own port (or port = 0 for both)",
            )
        ]
    return []


def gpu_findings(config: ExperimentConfig, gpus: list[GpuInfo] | None) -> list[Finding]:
    """Both arms must see GPUs that exist, of one model and memory size; a CPU box runs the embedded engine."""
    wanted = {arm: config.arm(arm).gpus for arm in ARMS}
    if gpus is None:
        placed = [config.arm(arm) for arm in ARMS if wanted[arm]]
        if placed and all(embedded_engine_args(arm.command or []) is not None for arm in placed):
            labels = "no GPU: the embedded engine takes arms.*.gpus as labels only (CUDA_VISIBLE_DEVICES)"
            return [Finding("ok", "gpus", labels)]
        if placed:
            return [
                Finding(
                    "fail",
                    "gpus",
                    "the arms name GPUs but none is visible (no nvidia-smi); run on the "
                    "GPU host or remove arms.*.gpus for the embedded engine",
                )
            ]
        return [Finding("ok", "gpus", "no GPU: embedded engine only")]
    by_index = {gpu.index: gpu for gpu in gpus}
    found = []
    for arm, ids in wanted.items():
        unknown = [i for i in ids if i not in by_index]
        if unknown:
            found.append(
                Finding(
                    "fail",
                    "gpus",
                    f"arms.{arm}.gpus names GPU(s) {unknown} but this host has {sorted(by_index)}; fix arms.{arm}.gpus",
                )
            )
    models = {
        arm: sorted({(by_index[i].name, by_index[i].memory_mib) for i in ids if i in by_index})
        for arm, ids in wanted.items()
    }
    if all(models.values()) and models["baseline"] != models["candidate"]:
        found.append(
            Finding(
                "fail",
                "gpus",
                f"the arms get different GPUs ({models['baseline']} vs "
                f"{models['candidate']}); give both arms the same GPU model",
            )
        )
    shared = set(wanted["baseline"]) & set(wanted["candidate"])
    if config.order == "simultaneous" and shared:
        found.append(Finding("fail", "gpus", "simultaneous arms share a GPU; give each arm its own GPU"))
    if not found:
        names = ", ".join(f"{g.index}: {g.name} {g.memory_mib} MiB" for g in gpus)
        found.append(Finding("ok", "gpus", f"{len(gpus)} GPU(s) visible ({names})"))
    if shared and config.order != "simultaneous" and not config.restart_per_repeat:
        found.append(
            Finding(
                "ok",
                "gpus",
                f"both servers stay resident on GPU(s) {sorted(shared)} and replay one at a time; each must fit in "
                "its share of the memory (vLLM: --gpu-memory-utilization 0.45 each)",
            )
        )
    return found


def energy_findings(config: ExperimentConfig, gpus: list[GpuInfo] | None) -> list[Finding]:
    """Where the arms' energy will come from: the GPUs' NVML energy counter, else (said before the run, not after)
    the once-a-second power samples."""
    placed = sorted({i for arm in ARMS for i in config.arm(arm).gpus})
    if gpus is None or not placed:
        return []  # no GPU, or arms without `gpus`: the GPU finding and the report say why energy is not measured
    counters = EnergyCounters(placed)
    counters.close()
    if counters.error is None:
        return [Finding("ok", "energy", f"NVML energy counter readable on GPU(s) {placed}")]
    return [
        Finding(
            "warn",
            "energy",
            f"{counters.error}: energy per successful request will come from power sampled once a second; the "
            "counter needs nvidia-ml-py (a replaybench dependency), the NVIDIA driver's NVML library and a Volta or "
            "later GPU",
        )
    ]


def _placement(config: ExperimentConfig) -> list[Finding]:
    """Arm and GPU must not be confounded: swapped every repeat, over an even number of repeats."""
    base, cand = config.arm("baseline"), config.arm("candidate")
    if base.gpus == cand.gpus:
        return []
    policy = placement_policy(config)
    if not policy["swaps"]:
        return [Finding("warn", "placement", f"{policy['note']}; run an A/A to measure the slot effect")]
    if config.repeats % 2:
        return [
            Finding(
                "warn",
                "placement",
                f"{policy['note']}; {config.repeats} repeats leave one placement more often: use an even number",
            )
        ]
    return [Finding("ok", "placement", str(policy["note"]))]


def model_config_path(arm: ArmConfig) -> Path | None:
    """The model's config.json, when the command names a model directory, a config file or a shipped model."""
    settings = parse_command(arm.command or [])
    words = str(settings.get(PROGRAM) or "").split()
    named = [settings.get("--model"), settings.get("--model-config")]
    named += [words[words.index("serve") + 1]] if "serve" in words[:-1] else []
    for name in filter(None, named):
        path = Path(name) if Path(name).is_absolute() or arm.cwd is None else arm.cwd / name
        path = path / "config.json" if path.is_dir() else path
        if path.suffix == ".json" and path.is_file():
            return path
    return _shipped_model(settings.get("--model-config"), arm.cwd)


def _shipped_model(name: str | None, cwd: Path | None) -> Path | None:
    """The shipped config a serve-sim `--model-config NAME` means (an unknown name is serve-sim's own error)."""
    from harness.sim.model_config import resolve_model_config

    try:
        path = resolve_model_config(name, cwd) if name else None
    except UserError:
        return None
    return path if path is not None and path.is_file() else None


def _architecture(config: ExperimentConfig) -> list[Finding]:
    found = []
    for label in ARMS:
        arm = config.arm(label)
        if not arm.supports:
            continue
        path = model_config_path(arm)
        if path is None:
            found.append(
                Finding(
                    "warn",
                    "model",
                    f"arm {label}: no model config.json found in its command; the architecture cannot be checked",
                )
            )
            continue
        try:
            architectures = json.loads(path.read_text()).get("architectures") or []
        except (OSError, ValueError) as error:
            found.append(Finding("fail", "model", f"{path}: unreadable model config ({error})"))
            continue
        if set(architectures) & set(arm.supports):
            found.append(Finding("ok", "model", f"arm {label} supports {', '.join(architectures)}"))
        else:
            found.append(
                Finding(
                    "fail",
                    "model",
                    f"arm {label} supports {arm.supports}, but {path} is {architectures}; use a supported model",
                )
            )
    return found


def _declarations(config: ExperimentConfig) -> list[Finding]:
    from harness.analysis.look_levels import looks_rule_text

    found = []
    for table, what in (("slo", "SLOs"), ("decision", "decision rule and margins"), ("quality", "quality limits")):
        if config.declared(table):
            found.append(Finding("ok", table, f"{what} declared"))
        else:
            found.append(Finding("warn", table, f"no [{table}] table: the default {what} apply; declare them"))
    if config.decision.looks:  # each look's level, seen before the run it is pre-registered for
        found.append(Finding("ok", "decision", f"sequential {looks_rule_text(config.decision)}"))
    return found


def _policy(config: ExperimentConfig) -> list[Finding]:
    if config.is_aa:
        return [Finding("ok", "policy", "A/A run: the candidate is the baseline (calibrates the noise floor)")]
    found = [
        Finding(
            "warn",
            "policy",
            f"arms.{label} has no command: its settings cannot be compared; add the command that started it",
        )
        for label in ARMS
        if not config.arm(label).command
    ]
    undeclared = [d for d in arm_differences(config) if not d.declared]
    for diff in undeclared:
        found.append(
            Finding(
                "warn",
                "policy",
                f"{diff.kind} {diff.key} differs ({diff.baseline!r} vs "
                f"{diff.candidate!r}) but is not in policy_change; make the arms "
                "equal there or declare it",
            )
        )
    if not config.policy_change:
        found.append(
            Finding("warn", "policy", "policy_change is empty: declare the flags/env that define the candidate policy")
        )
    elif not undeclared:
        found.append(Finding("ok", "policy", f"only the declared policy change differs: {config.policy_change}"))
    return found


def run_checks(config: ExperimentConfig) -> list[Finding]:
    """All preflight findings, in the order they are printed."""
    found = _trace(config) + _quality(config)
    for label in ARMS:
        arm = config.arm(label)
        if label == "candidate" and config.arms.candidate == "baseline":
            continue
        found += _launch(label, arm) if arm.launched else _attached(label, arm)
    gpus = query_gpus()
    return (
        found
        + _ports(config)
        + gpu_findings(config, gpus)
        + energy_findings(config, gpus)
        + _placement(config)
        + _architecture(config)
        + _declarations(config)
        + _policy(config)
    )
