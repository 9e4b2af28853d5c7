"""One arm's probes for `replaybench capacity`: its server's lifecycle around the replays of each probe.

An adapter around the paired runner's pieces (ArmServer start/ready/stop for launched and `url` arms, the
warm-up request, the configured trace slice), so a probe treats its server exactly like a paired repeat does:
`restart_per_repeat = true` gives every replay a fresh server. Scoring a result file (SLO attainment, cost per
successful request) belongs to analysis, which this layer must not import: the CLI passes it in as `score`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UserError
from harness.experiment.arm_server import ArmServer
from harness.experiment.capacity import Probe, ProbeRun, judge_probe
from harness.experiment.config import ExperimentConfig
from harness.experiment.openai_http import first_model, generate
from harness.experiment.replay_settings import replay_options
from harness.experiment.runner import WARMUP_MAX_TOKENS, WARMUP_PROMPT, Progress
from harness.replay import ReplayOptions
from harness.servers import ServerStartError
from harness.trace.model import Trace

Score = Callable[[Path], tuple[float, float]]  # result file -> (SLO attainment, cost per successful request)


@dataclass(frozen=True)
class CapacityFiles:
    """Where a capacity search writes inside a run directory (next to, never over, a paired run's files)."""

    root: Path

    @property
    def capacity_json(self) -> Path:
        return self.root / "capacity.json"

    def result(self, arm: str, time_scale: float, repeat: int) -> Path:
        return self.root / "capacity" / f"{arm}-s{time_scale:.5f}-r{repeat}.parquet"

    def server_log(self, arm: str, time_scale: float, repeat: int) -> Path:
        return self.root / "capacity" / "servers" / f"{arm}-s{time_scale:.5f}-r{repeat}.log"


class ArmProber:
    """Replays the trace against one arm `repeats` times per probe; `close()` stops its server."""

    def __init__(
        self,
        config: ExperimentConfig,
        arm: str,
        trace: Trace,
        files: CapacityFiles,
        repeats: int,
        score: Score,
        progress: Progress = lambda _what, _done: None,
    ) -> None:
        self.config, self.arm, self.trace, self.files = config, arm, trace, files
        self.repeats, self.score, self.progress = repeats, score, progress
        self.server = ArmServer(arm, config.arm(arm))
        self._model: str | None = None

    def probe(self, time_scale: float) -> Probe:
        runs = tuple(self._replay(time_scale, repeat) for repeat in range(self.repeats))
        return judge_probe(time_scale, runs, self.config.slo.attainment_target)

    def close(self) -> None:
        self.server.stop()

    def _replay(self, time_scale: float, repeat: int) -> ProbeRun:
        from harness.replay import run_replay

        what = f"{self.arm} {1 / time_scale:.2f}x r{repeat}"
        self.progress(what, 0)
        self._ensure_started(self.files.server_log(self.arm, time_scale, repeat))
        output = self.files.result(self.arm, time_scale, repeat)
        outcome = run_replay(
            self.trace,
            self.server.base_url,
            self._options(time_scale),
            output,
            arm=self.arm,
            repeat=repeat,
            progress=False,
        )
        if outcome.interrupted:
            raise KeyboardInterrupt
        self.progress(what, 1)
        crashed = None if self.server.alive() else self.server.exit_description()
        if self.config.restart_per_repeat or crashed:
            self.server.stop()
        relative = str(output.relative_to(self.files.root))
        if crashed:
            return ProbeRun(repeat, False, None, None, f"{crashed} during the replay", relative)
        attainment, cost = self.score(outcome.path)
        reason = "replay invalid: " + "; ".join(outcome.fidelity.reasons) if not outcome.fidelity.valid else ""
        return ProbeRun(repeat, outcome.fidelity.valid, attainment, cost, reason, relative)

    def _ensure_started(self, log: Path) -> None:
        """A fresh (or revived) server, checked once against the declared version/plugin, then warmed up."""
        if self.config.restart_per_repeat or not self.server.alive():
            try:
                self.server.start(log)
            except ServerStartError as error:
                raise UserError(f"arm {self.arm}: {error}; `replaybench check` helps find why") from None
        if self._model is None:
            self.server.verify(self.server.identity())
            self._model = self.server.arm.model or first_model(self.server.base_url)
        for _ in range(self.config.replay.warmup_requests):
            generate(
                self.server.base_url,
                self._model,
                self.server.arm.api or "completions",
                WARMUP_PROMPT,
                WARMUP_MAX_TOKENS,
            )

    def _options(self, time_scale: float) -> ReplayOptions:
        """The paired runs' replay settings, at the probe's time scale instead of the config's."""
        return replay_options(
            self.config,
            self.arm,
            self._model,
            {"replaybench.capacity": "true"},
            time_scale=time_scale,
            save_outputs=False,
        )
