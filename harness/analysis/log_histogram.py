"""Fixed log-spaced latency histograms: the compact per-time-block summary of a run's latencies.

Keeping every inter-token gap of 20 runs in memory would cost gigabytes; a histogram per (run, time
block) on one fixed grid is a few MB, adds up across blocks, and gives quantiles to well under 0.5 %.
"""

from __future__ import annotations

import numpy as np

LOG_MIN = np.log(1e-5)  # 10 µs
LOG_MAX = np.log(1e4)  # ~2.8 h
BINS = 4096
BIN_WIDTH = (LOG_MAX - LOG_MIN) / BINS
EDGES_S = np.exp(LOG_MIN + BIN_WIDTH * np.arange(BINS + 1))


def bin_index(seconds: np.ndarray) -> np.ndarray:
    """Bin of each finite latency (clipped into the grid; zero lands in the first bin). float32 for speed."""
    with np.errstate(divide="ignore", invalid="ignore"):
        position = (np.log(np.asarray(seconds, np.float32)) - np.float32(LOG_MIN)) * np.float32(1 / BIN_WIDTH)
    np.clip(position, 0, BINS - 1, out=position)
    return position.astype(np.int64)


def block_histograms(seconds: np.ndarray, blocks: np.ndarray, n_blocks: int) -> np.ndarray:
    """Counts per (time block, bin) as int32, shape (n_blocks, BINS); NaN latencies are skipped."""
    seconds, blocks = np.asarray(seconds), np.asarray(blocks, np.int64)
    keep = np.isfinite(seconds)
    if not keep.all():  # boolean indexing copies tens of millions of values: only when needed
        seconds, blocks = seconds[keep], blocks[keep]
    flat = bin_index(seconds)
    flat += blocks * BINS
    return np.bincount(flat, minlength=n_blocks * BINS).astype(np.int32).reshape(n_blocks, BINS)


def quantiles_from_counts(counts: np.ndarray, probs: tuple[float, ...]) -> np.ndarray:
    """Quantiles (seconds) from histograms over the last axis, interpolating log-linearly within a bin.

    Returns shape counts.shape[:-1] + (len(probs),); NaN where a histogram is empty.
    """
    counts = np.asarray(counts, float)
    cumulative = np.cumsum(counts, axis=-1)
    total = cumulative[..., -1:]
    out = np.empty((*counts.shape[:-1], len(probs)))
    for k, prob in enumerate(probs):
        rank = prob * total
        index = np.minimum((cumulative < rank).sum(axis=-1, keepdims=True), counts.shape[-1] - 1)
        below = np.take_along_axis(cumulative, index, axis=-1) - np.take_along_axis(counts, index, axis=-1)
        inside = np.take_along_axis(counts, index, axis=-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            fraction = np.clip(np.where(inside > 0, (rank - below) / inside, 0.5), 0, 1)
        out[..., k] = np.exp(LOG_MIN + BIN_WIDTH * (index + fraction))[..., 0]
    out[total[..., 0] == 0] = np.nan
    return out
