"""Two-stage block bootstrap of quantile ratios (DESIGN §7): resample repeat pairs, then time blocks.

Requests inside one run share queues, so they are never resampled as if independent. Stage 1 draws repeat
pairs with replacement; stage 2 draws time blocks with replacement inside each drawn repeat, using the
SAME block indices for both arms so that the pairing by trace time survives. Each resampled run is a
weighted sum of its per-block histograms, which makes the whole bootstrap a few matrix products.
"""

from __future__ import annotations

import numpy as np

from harness.analysis.log_histogram import occupied_bins, quantiles_from_counts


def resampled_log_ratios(
    baseline: np.ndarray, candidate: np.ndarray, probs: tuple[float, ...], resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """Bootstrap distribution of the mean log quantile ratio (candidate / baseline).

    `baseline` and `candidate` are per-block histograms of shape (repeats, blocks, bins).
    Returns shape (resamples, len(probs)).
    """
    repeats, blocks, _ = baseline.shape
    bins = occupied_bins(np.stack([baseline, candidate]))
    baseline, candidate = baseline[..., bins], candidate[..., bins]
    drawn_repeats = rng.integers(0, repeats, size=(resamples, repeats))
    # Block multiplicities: how often each block is drawn when drawing `blocks` blocks with replacement.
    drawn_blocks = rng.integers(0, blocks, size=(resamples * repeats, blocks))
    weights = np.zeros((resamples * repeats, blocks), np.float32)
    np.add.at(weights, (np.repeat(np.arange(resamples * repeats), blocks), drawn_blocks.ravel()), 1.0)
    flat_repeats = drawn_repeats.ravel()
    log_ratio = np.empty((resamples * repeats, len(probs)))
    for repeat in range(repeats):
        rows = np.flatnonzero(flat_repeats == repeat)
        if not len(rows):
            continue
        arms = [weights[rows] @ hist[repeat].astype(np.float32) for hist in (baseline, candidate)]
        quantiles = [quantiles_from_counts(counts, probs, bins.start) for counts in arms]
        log_ratio[rows] = np.log(quantiles[1]) - np.log(quantiles[0])
    return log_ratio.reshape(resamples, repeats, len(probs)).mean(axis=1)


def percentile_interval(samples: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval over the first axis, ignoring resamples where a quantile was undefined."""
    return (np.nanquantile(samples, alpha / 2, axis=0), np.nanquantile(samples, 1 - alpha / 2, axis=0))
