"""The decode window: engine steps from the last first token to the first last token, on the engine's clock."""

import pytest

from replayssm_patch.gpu.decode_window import EngineStep, decode_window


def _steps(batch: int, admit_per_step: int, tokens: int, prefill_s: float, decode_s: float) -> list[EngineStep]:
    """A scheduler admitting `admit_per_step` requests per prefill step, each then getting one token per step."""
    made, waiting, steps, clock = [], batch, [], 100.0
    while waiting or any(m < tokens for m in made):
        admitted = min(admit_per_step, waiting)
        waiting -= admitted
        clock += prefill_s if admitted else decode_s
        running = [i for i, m in enumerate(made) if m < tokens]
        for i in running:
            made[i] += 1
        made += [1] * admitted
        rows = len(running) + admitted
        finished = sum(made[i] == tokens for i in running) + (admitted if tokens == 1 else 0)
        steps.append(EngineStep(clock, rows, rows, admitted, finished))
    return steps


def test_the_window_holds_only_whole_batch_decode_steps():
    window = decode_window(_steps(8, 2, 40, prefill_s=0.5, decode_s=0.004), 8)
    assert window is not None
    # prefill in steps 1-4, the first request's 40th token in step 40: 36 periods, none of them a prefill
    assert (window.steps, window.mean_ms, window.p50_ms, window.max_ms) == (36, 4.0, 4.0, 4.0)
    assert window.tokens_per_s == 2000.0  # 8 requests every 4 ms


def test_a_stall_inside_the_window_shows_in_the_mean_and_max_not_the_median():
    steps = _steps(4, 4, 30, prefill_s=0.5, decode_s=0.002)
    stalled = [*steps[:10], *(EngineStep(s.stamp_s + 1.0, s.rows, s.tokens, s.started, s.finished) for s in steps[10:])]
    window = decode_window(stalled, 4)
    assert window is not None and window.steps == 29
    assert window.p50_ms == pytest.approx(2.0) and window.max_ms == pytest.approx(1002.0)
    assert window.mean_ms == pytest.approx((28 * 2.0 + 1002.0) / 29, abs=1e-3)
    # the sequence says where: the eleventh period (the step after the stall began), the others at the pace
    assert len(window.periods_ms) == 29 and window.periods_ms[9] == pytest.approx(1002.0)
    assert all(ms == pytest.approx(2.0) for i, ms in enumerate(window.periods_ms) if i != 9)
    assert window.step_tokens == (4,) * 29


@pytest.mark.parametrize(
    ("steps", "why"),
    [
        (_steps(8, 2, 3, 0.5, 0.004), "the first request ends before the last one starts (a short generate)"),
        ([EngineStep(0.0, 2, 2, 2, 0), EngineStep(0.0, 2, 2, 0, 2)], "no engine timestamps (stats off)"),
        ([], "no step at all"),
    ],
)
def test_no_window_when_the_batch_never_decoded_whole(steps, why):
    assert decode_window(steps, 8 if steps and steps[0].stamp_s else 2) is None, why


def test_speculative_steps_count_every_token_they_emit():
    """Under speculation a step emits up to 1 + k tokens per request: the window's throughput counts them all."""
    plain = _steps(4, 4, 40, prefill_s=0.5, decode_s=0.010)
    three_each = [EngineStep(s.stamp_s, s.rows, 3 * s.rows if s.started == 0 else s.rows, s.started, s.finished)
                  for s in plain]  # fmt: skip
    window = decode_window(three_each, 4)
    assert window is not None and window.mean_ms == pytest.approx(10.0) and window.tokens_per_s == 1200.0


def test_a_batch_run_in_waves_has_no_window():
    """A KV cache too small for B: half the batch finishes before the other half is admitted."""
    first, second = _steps(4, 4, 10, 0.5, 0.004), _steps(4, 4, 10, 0.5, 0.004)
    offset = first[-1].stamp_s
    waves = [*first, *(EngineStep(s.stamp_s + offset, s.rows, s.tokens, s.started, s.finished) for s in second)]
    assert decode_window(waves, 8) is None
