"""Correlation metrics for similarity and regression scores (numpy; no scipy needed)."""

from __future__ import annotations

import numpy as np


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``values`` [n], tied values sharing the mean of their ranks (``scipy.stats.rankdata``'s
    default, ``method="average"``)."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(1, len(values) + 1, dtype=np.float64)
    ordered = values[order]
    # Runs of equal values in sorted order get the mean of the ranks they span.
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(values)]
    mean_rank = (starts + ends + 1) / 2.0  # mean of (start+1 .. end)
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's correlation of ``x`` and ``y`` [n]; 0.0 when either is constant (undefined)."""
    x = np.asarray(x, dtype=np.float64) - np.mean(x)
    y = np.asarray(y, dtype=np.float64) - np.mean(y)
    denominator = float(np.sqrt((x * x).sum() * (y * y).sum()))
    return float((x * y).sum() / denominator) if denominator > 0 else 0.0


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation: Pearson's correlation of the average ranks (ties share a rank)."""
    return pearson(average_ranks(x), average_ranks(y))
