"""The one place an experiment's settings become replay options, so paired runs and capacity probes agree."""

from __future__ import annotations

from harness.experiment.config import ExperimentConfig
from harness.replay import ReplayOptions


def replay_options(
    config: ExperimentConfig,
    arm: str,
    model: str | None,
    metadata: dict[str, str],
    time_scale: float | None = None,
    save_outputs: bool | None = None,
) -> ReplayOptions:
    """Replay options for `arm`; `time_scale` and `save_outputs` default to the config's own."""
    settings, decision = config.replay, config.decision
    return ReplayOptions(
        api=config.arm(arm).api,
        time_scale=config.trace.time_scale if time_scale is None else time_scale,
        workers=settings.workers,
        max_inflight=settings.max_inflight,
        seed=settings.seed,
        usage_per_chunk=settings.usage_per_chunk,
        model=model,
        lag_budget_s=decision.lag_budget_s,
        rate_tolerance=decision.rate_tolerance,
        save_outputs=settings.save_outputs if save_outputs is None else save_outputs,
        request_timeout_s=settings.request_timeout_s,
        extra_metadata={"replaybench.experiment": config.name} | metadata,
    )
