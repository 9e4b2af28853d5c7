"""Open-loop replay (DESIGN §4): send every request of a trace at its recorded moment and record what it got.

Public API (used by `replaybench replay` and by the paired experiment runner):

    from harness.replay import ReplayOptions, ReplayOutcome, run_replay, recover_replay

    outcome = run_replay(trace, "http://127.0.0.1:8000", ReplayOptions(time_scale=0.5, workers=2, seed=0),
                         output=Path("results/baseline-r0.parquet"), arm="baseline", repeat=0, progress=False)
    outcome.path          # the result Parquet (RESULT_SCHEMA), written atomically at the end
    outcome.fidelity      # harness.records.fidelity.Fidelity: send lag, achieved vs offered rate, per-worker
                          # receive lag (worker_loads) and CPU share, valid
    outcome.complete      # False when interrupted (Ctrl-C / SIGTERM): the file keeps every finished request
    outcome.interrupted   # True after Ctrl-C / SIGTERM; the caller should stop too

- `run_replay` is synchronous (do not call it from inside a running event loop); it starts
  `options.workers` sender processes through a multiprocessing forkserver, so callers may have threads,
  and a script that calls it needs the usual `if __name__ == "__main__":` guard (multiprocessing rule).
- `trace` is a `harness.trace.model.Trace` already sliced by the caller (`trace.slice(start, duration, limit)`);
  `options.time_scale` is applied here. Request bodies depend only on (trace rows, seed, model, api, server
  tokenizer), so two arms serving the same model receive byte-identical bodies.
- An unreachable server raises `harness.errors.UserError` (one line) before anything is sent.
- While running, finished rows go to `<output>.partial/` (one JSONL segment per worker); if the process dies,
  `recover_replay(output)` (CLI: `replaybench replay-recover OUTPUT`) turns them into a result file marked
  `replaybench.complete = false`.
"""

from harness.replay.options import ReplayOptions, ReplayOutcome

__all__ = ["ReplayOptions", "ReplayOutcome", "recover_replay", "run_replay"]


def __getattr__(name: str) -> object:
    """Load the runner (aiohttp, multiprocessing) only when it is used, so `import harness.replay` stays light."""
    if name in ("run_replay", "recover_replay"):
        from harness.replay import runner

        return getattr(runner, name)
    raise AttributeError(name)
