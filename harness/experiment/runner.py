"""The paired-experiment loop (DESIGN §6): per repeat, per arm in policy order: start, warm up, replay, scrape,
stop; crashed or invalid attempts are retried up to `max_attempts` and every attempt is kept.

The caller creates the run directory and freezes the config first (`rundir.py`); `run_experiment` only
adds to it, so an interrupted run can be resumed (`resume=True` continues from the last complete repeat).
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.analysis.analyse import analyse_run_dir
from harness.analysis.model import Outcome
from harness.atomic import atomic_path
from harness.errors import UserError
from harness.experiment.arm_server import ArmServer
from harness.experiment.attempts import Attempt, AttemptLog, Status
from harness.experiment.config import ARMS, ExperimentConfig
from harness.experiment.environment import record_placement, record_server
from harness.experiment.openai_http import first_model, generate, tokenize
from harness.experiment.ordering import arm_order
from harness.experiment.placement import placement
from harness.experiment.quality import compare_outputs, load_tasks
from harness.experiment.replay_settings import replay_options
from harness.experiment.simultaneous import ReplayJob, replay_together
from harness.experiment.telemetry import RunTelemetry
from harness.records.result_schema import META_CAPACITY_SOURCE, META_GPUS, META_LOAD_SHARE, META_SIMULATED
from harness.records.run_dir import RunDir
from harness.replay import ReplayOptions, ReplayOutcome
from harness.replay.segments import partial_dir
from harness.servers import ServerStartError, scrape_metrics
from harness.servers.cleanup import termination_signals_raise
from harness.trace.model import Trace

WARMUP_PROMPT = "Warm-up request, not measured: say something about the weather."
WARMUP_MAX_TOKENS = 16

Progress = Callable[[str, int], None]  # (what is happening now, steps finished since the last call)


@dataclass(frozen=True)
class Verdict:
    """How one attempt of one arm went."""

    status: Status
    reason: str


def load_trace(config: ExperimentConfig) -> Trace:
    """The configured slice (time scaling is applied by the replay, so both arms share one schedule)."""
    selection = config.trace
    return Trace.read(selection.path).slice(selection.start_s, selection.duration_s, selection.limit)


class ExperimentRunner:
    def __init__(self, config: ExperimentConfig, run: RunDir, progress: Progress | None = None) -> None:
        self.config = config
        self.run = run
        self.trace = load_trace(config)
        self.log = AttemptLog(run.attempts_json)
        self.servers = {arm: ArmServer(arm, config.arm(arm)) for arm in ARMS}
        self._models: dict[str, str] = {}
        self._simulated: dict[str, bool] = {}
        self._placement = placement(config, 0)
        self._progress = progress or (lambda _what, _steps: None)

    # ---- the loop -------------------------------------------------------------------------------------
    def execute(self) -> None:
        """Run every repeat not yet complete, then the quality tasks; servers are stopped however it ends."""
        with termination_signals_raise():
            try:
                complete = self.log.complete_repeats(ARMS)
                if complete:
                    self._progress(f"resuming after {len(complete)} complete repeat(s)", 2 * len(complete))
                for repeat in range(self.config.repeats):
                    if repeat in complete:
                        continue
                    if self._decided_after(repeat):
                        break
                    self._forget_partial(repeat)
                    self._place(repeat)
                    if self.config.order == "simultaneous":
                        self._run_pair(repeat)
                    else:
                        for arm in arm_order(self.config.order, repeat, self.config.seed):
                            self._run_arm(arm, repeat)
                if self.config.quality_tasks is not None:
                    self._progress("quality tasks", 0)
                    self._run_quality(self.config.quality_tasks)
            finally:
                for server in self.servers.values():
                    server.stop()

    def _decided_after(self, repeats: int) -> bool:
        """At a pre-registered look (`[decision] looks`), whether the first `repeats` repeats already decide (KEEP
        or REJECT at the look's level): the rest are then not run."""
        if repeats not in self.config.decision.looks:
            return False
        outcome = analyse_run_dir(self.run.root).summary.decision.outcome
        decided = outcome in (Outcome.KEEP, Outcome.REJECT)
        ending = f": {outcome.value}, the remaining repeats are not run" if decided else f": {outcome.value}, go on"
        self._progress(f"look at {repeats} repeats{ending}", 0)
        return decided

    def _forget_partial(self, repeat: int) -> None:
        """A repeat cut short earlier is re-run whole, so its arms stay adjacent in time (files stay in attempts/)."""
        if any(a.repeat == repeat and a.final for a in self.log.attempts):
            self.log.demote(repeat, "repeat interrupted; run again on resume")
            for arm in ARMS:
                self.run.result(arm, repeat).unlink(missing_ok=True)

    def _place(self, repeat: int) -> None:
        """This repeat's GPUs per arm, recorded in env.json; a server kept up on other GPUs is stopped first.

        Every moved server is stopped before any is started, so two servers never meet on one GPU.
        """
        self._placement = placement(self.config, repeat)
        for arm, server in self.servers.items():
            if server.arm.launched and server.alive() and server.gpus != self._placement.gpus[arm]:
                server.stop()
        record_placement(self.run.env_json, self.config, self._placement)

    def _run_arm(self, arm: str, repeat: int) -> None:
        for tries in range(1, self.config.max_attempts + 1):
            self._progress(f"{arm} r{repeat} attempt {tries}", 0)
            attempt = self._next_attempt(arm, repeat)
            output = self.run.attempt(arm, repeat, attempt)
            verdict, outcome = self._attempt(arm, repeat, attempt, output)
            final = verdict.status == "accepted" or tries == self.config.max_attempts
            self._record(arm, repeat, attempt, verdict, outcome, final)
            if final:
                self._progress(f"{arm} r{repeat} {verdict.status}", 1)
                return

    def _attempt(self, arm: str, repeat: int, attempt: int, output: Path) -> tuple[Verdict, ReplayOutcome | None]:
        server = self.servers[arm]
        started = self._ensure_started(arm, repeat)
        if started is not None:
            return started, None
        scrape_metrics(server.base_url, self.run.metrics(arm, repeat, "before"))
        with self._telemetry(arm, repeat):
            outcome = self._replay(arm, repeat, attempt, output)
        scrape_metrics(server.base_url, self.run.metrics(arm, repeat, "after"))
        verdict = self._judge(arm, outcome)
        if self.config.restart_per_repeat or verdict.status == "crashed":
            server.stop()
        return verdict, outcome

    def _run_pair(self, repeat: int) -> None:
        """Both arms at once against one shared start; a failure of either re-runs the pair."""
        for tries in range(1, self.config.max_attempts + 1):
            self._progress(f"both arms r{repeat} attempt {tries}", 0)
            attempts = {arm: self._next_attempt(arm, repeat) for arm in ARMS}
            verdicts, outcomes = self._pair_attempt(repeat, attempts)
            last = tries == self.config.max_attempts
            ok = all(v.status == "accepted" for v in verdicts.values())
            for arm in ARMS:
                verdict = verdicts[arm]
                if not ok and not last and verdict.status == "accepted":
                    other = next(a for a in ARMS if a != arm)
                    verdict = Verdict("retried", f"paired arm {other} was {verdicts[other].status}; pair run again")
                self._record(arm, repeat, attempts[arm], verdict, outcomes.get(arm), final=ok or last)
            if ok or last:
                self._progress(f"r{repeat} done", 2)
                return

    def _pair_attempt(
        self, repeat: int, attempts: dict[str, int]
    ) -> tuple[dict[str, Verdict], dict[str, ReplayOutcome]]:
        failed = {arm: v for arm in ARMS if (v := self._ensure_started(arm, repeat)) is not None}
        if failed:
            for server in self.servers.values():
                server.stop()
            return {arm: failed.get(arm, Verdict("retried", "the paired server failed to start")) for arm in ARMS}, {}
        for arm in ARMS:
            scrape_metrics(self.servers[arm].base_url, self.run.metrics(arm, repeat, "before"))
        jobs = [
            ReplayJob(
                arm,
                repeat,
                self.servers[arm].base_url,
                self.run.attempt(arm, repeat, attempts[arm]),
                self._options(arm, attempts[arm]),
            )
            for arm in ARMS
        ]
        with self._telemetry(ARMS[0], repeat), self._telemetry(ARMS[1], repeat):
            outcomes = replay_together(self.trace, jobs)
        verdicts = {}
        for arm in ARMS:
            scrape_metrics(self.servers[arm].base_url, self.run.metrics(arm, repeat, "after"))
            self._stop_if_interrupted(arm, repeat, attempts[arm], outcomes[arm])
            verdicts[arm] = self._judge(arm, outcomes[arm])
        if self.config.restart_per_repeat or any(v.status == "crashed" for v in verdicts.values()):
            for server in self.servers.values():
                server.stop()
        return verdicts, outcomes

    # ---- one arm's pieces -----------------------------------------------------------------------------
    def _next_attempt(self, arm: str, repeat: int) -> int:
        """The next attempt number; an attempt that replaybench died in (SIGKILL, power loss) is listed first."""
        attempt = self.log.next_attempt(arm, repeat)
        while partial_dir(self.run.attempt(arm, repeat, attempt)).exists():
            orphan = partial_dir(self.run.attempt(arm, repeat, attempt))
            self.log.add(
                Attempt(
                    arm=arm,
                    repeat=repeat,
                    attempt=attempt,
                    status="retried",
                    reason="replaybench died during this attempt; its finished rows can be recovered "
                    "with `replaybench replay-recover`",
                    path=str(orphan.relative_to(self.run.root)),
                    final=False,
                )
            )
            attempt += 1
        return attempt

    def _ensure_started(self, arm: str, repeat: int) -> Verdict | None:
        """Start (or restart) the arm's server when needed and warm it up; a failure is a crashed attempt."""
        server = self.servers[arm]
        try:
            if self.config.restart_per_repeat or not server.alive():
                server.start(self.run.server_log(arm, repeat), self._placement.gpus[arm], repeat)
        except ServerStartError as error:
            return Verdict("crashed", str(error))
        self._identify(arm)  # a wrong version or a missing plugin stops the run: retrying cannot fix it
        try:
            self._warm_up(arm)
        except UserError as error:
            if server.alive():
                raise
            server.stop()
            return Verdict("crashed", f"{server.exit_description()} during warm-up ({error})")
        return None

    def _identify(self, arm: str) -> None:
        """Record the server's version and models in env.json the first time it is up (before any request)."""
        if arm in self._models:
            return
        server = self.servers[arm]
        identity = server.identity()
        server.verify(identity)
        record_server(self.run.env_json, arm, identity)
        self._models[arm] = server.arm.model or first_model(server.base_url)
        self._simulated[arm] = any("simulated" in str(owner).lower() for owner in identity.get("owned_by") or [])

    def _warm_up(self, arm: str) -> None:
        server = self.servers[arm]
        for _ in range(self.config.replay.warmup_requests):
            generate(
                server.base_url, self._models[arm], server.arm.api or "completions", WARMUP_PROMPT, WARMUP_MAX_TOKENS
            )

    def _options(self, arm: str, attempt: int) -> ReplayOptions:
        metadata = {
            "replaybench.attempt": str(attempt),
            "replaybench.mode": str(self.config.mode),
            META_SIMULATED: str(self._simulated.get(arm, False)).lower(),
            META_GPUS: ",".join(str(gpu) for gpu in self.servers[arm].gpus),
        }
        if self.config.trace.load is not None:
            metadata[META_LOAD_SHARE] = repr(self.config.trace.load)
        if self.config.trace.load_basis is not None:
            metadata[META_CAPACITY_SOURCE] = self.config.trace.load_basis.capacity_source
        return replay_options(self.config, arm, self._models.get(arm), metadata)

    def _telemetry(self, arm: str, repeat: int) -> RunTelemetry:
        """Host, the arm's GPUs and its server's load sampled while it replays (a retried attempt's file is replaced
        by the next)."""
        every = self.config.replay.server_gauges_s
        return RunTelemetry(
            self.run.telemetry(arm, repeat),
            gpus=self._placement.gpus[arm],
            server_url=self.servers[arm].base_url if every > 0 else None,
            server_interval_s=every,
        )

    def _replay(self, arm: str, repeat: int, attempt: int, output: Path) -> ReplayOutcome:
        from harness.replay import run_replay

        outcome = run_replay(
            self.trace,
            self.servers[arm].base_url,
            self._options(arm, attempt),
            output,
            arm=arm,
            repeat=repeat,
            progress=False,
        )
        self._stop_if_interrupted(arm, repeat, attempt, outcome)
        return outcome

    def _stop_if_interrupted(self, arm: str, repeat: int, attempt: int, outcome: ReplayOutcome) -> None:
        """An interrupted replay is recorded (its rows are kept) and the whole run stops, resumable."""
        if outcome.interrupted:
            self._record(
                arm, repeat, attempt, Verdict("retried", "interrupted (Ctrl-C or SIGTERM)"), outcome, final=False
            )
            raise KeyboardInterrupt

    def _judge(self, arm: str, outcome: ReplayOutcome) -> Verdict:
        server = self.servers[arm]
        if not server.alive():
            return Verdict("crashed", f"{server.exit_description()} during the replay")
        if not outcome.fidelity.valid:
            return Verdict("invalid", "; ".join(outcome.fidelity.reasons))
        return Verdict("accepted", "")

    def _record(
        self, arm: str, repeat: int, attempt: int, verdict: Verdict, outcome: ReplayOutcome | None, final: bool
    ) -> None:
        """Log the attempt; a final one with a result file becomes results/<arm>-r<k>.parquet."""
        path = outcome.path if outcome is not None else None
        reason = verdict.reason
        if final and verdict.status != "accepted":
            reason += f" (kept as the result: {self.config.max_attempts} attempt(s) used)"
        if final and path is not None:
            with atomic_path(self.run.result(arm, repeat)) as tmp:
                shutil.copyfile(path, tmp)
        self.log.add(
            Attempt(
                arm=arm,
                repeat=repeat,
                attempt=attempt,
                status=verdict.status,
                reason=reason,
                path=str(path.relative_to(self.run.root)) if path is not None else "",
                final=final and path is not None,
            )
        )
        if final and path is None:
            raise UserError(
                f"arm {arm}, repeat {repeat}: no attempt produced a result ({verdict.reason}); "
                f"see {self.run.root / 'servers'} and {self.run.attempts_json}"
            )

    # ---- quality --------------------------------------------------------------------------------------
    def _run_quality(self, task_file: Path) -> None:
        """Every task greedily on each arm in turn (one server up at a time), then compare the outputs."""
        tasks = load_tasks(task_file)
        outputs: dict[str, list[str]] = {}
        for arm in ARMS:
            server = self.servers[arm]
            if not server.alive():
                server.start(self.run.root / "servers" / f"{arm}-quality.log")
            self._identify(arm)
            api = server.arm.api or "completions"
            outputs[arm] = [
                generate(server.base_url, self._models[arm], api, task.prompt, task.max_tokens) for task in tasks
            ]
            if arm == ARMS[-1]:
                compare_outputs(
                    tasks,
                    outputs,
                    functools.partial(tokenize, server.base_url, self._models[arm]),
                    self.run.quality_json,
                )
            server.stop()
        self._progress("quality tasks done", 1)
