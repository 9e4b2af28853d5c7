"""Log histograms give accurate quantiles and split by time block."""

from __future__ import annotations

import numpy as np

from harness.analysis.log_histogram import block_histograms, quantiles_from_counts

PROBS = (0.5, 0.9, 0.99)


def test_histogram_quantiles_match_exact_quantiles_within_a_quarter_percent() -> None:
    values = np.random.default_rng(0).lognormal(np.log(0.05), 0.7, 200_000)
    counts = block_histograms(values, np.zeros(len(values), int), 1)[0]
    np.testing.assert_allclose(quantiles_from_counts(counts, PROBS), np.quantile(values, PROBS), rtol=2.5e-3)


def test_block_histograms_split_by_block_and_skip_nan() -> None:
    counts = block_histograms(np.array([0.01, 0.02, np.nan, 5.0]), np.array([0, 1, 1, 1]), 2)
    assert counts.shape[0] == 2 and counts[0].sum() == 1 and counts[1].sum() == 2
