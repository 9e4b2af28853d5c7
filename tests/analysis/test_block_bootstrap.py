"""Log histograms give accurate quantiles; the two-stage bootstrap keeps arms paired and covers the truth."""

from __future__ import annotations

import numpy as np

from harness.analysis.block_bootstrap import percentile_interval, resampled_log_ratios
from harness.analysis.log_histogram import block_histograms, quantiles_from_counts

PROBS = (0.5, 0.9, 0.99)


def test_histogram_quantiles_match_exact_quantiles_within_a_quarter_percent() -> None:
    values = np.random.default_rng(0).lognormal(np.log(0.05), 0.7, 200_000)
    counts = block_histograms(values, np.zeros(len(values), int), 1)[0]
    np.testing.assert_allclose(quantiles_from_counts(counts, PROBS), np.quantile(values, PROBS), rtol=2.5e-3)


def test_block_histograms_split_by_block_and_skip_nan() -> None:
    counts = block_histograms(np.array([0.01, 0.02, np.nan, 5.0]), np.array([0, 1, 1, 1]), 2)
    assert counts.shape[0] == 2 and counts[0].sum() == 1 and counts[1].sum() == 2


def _runs(rng: np.random.Generator, repeats: int, load: np.ndarray, factor: float) -> np.ndarray:
    """Per-block histograms of runs whose blocks differ in load (the same trace load for both arms)."""
    blocks = len(load)
    out = []
    for _ in range(repeats):
        values = rng.lognormal(np.log(0.1), 0.5, (blocks, 300)) * load[:, None] * factor
        out.append(block_histograms(values.ravel(), np.repeat(np.arange(blocks), 300), blocks))
    return np.stack(out)


def test_identical_arms_give_a_degenerate_interval_because_block_indices_are_shared() -> None:
    rng = np.random.default_rng(1)
    runs = _runs(rng, repeats=4, load=rng.lognormal(0, 0.3, 12), factor=1.0)
    samples = resampled_log_ratios(runs, runs.copy(), PROBS, 200, np.random.default_rng(2))
    np.testing.assert_allclose(samples, 0.0, atol=1e-12)


def test_interval_covers_the_true_ratio_and_is_not_degenerate() -> None:
    rng = np.random.default_rng(3)
    load = rng.lognormal(0, 0.3, 16)
    baseline = _runs(rng, repeats=5, load=load, factor=1.0)
    candidate = _runs(rng, repeats=5, load=load, factor=0.8)
    low, high = percentile_interval(resampled_log_ratios(baseline, candidate, PROBS, 300, rng), 0.05)
    assert np.all(low < np.log(0.8) + 0.02) and np.all(high > np.log(0.8) - 0.02)
    assert np.all(high - low > 0.005)
