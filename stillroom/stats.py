"""Paired bootstrap comparison of two systems scored on the same problems."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Index entries generated per chunk: bounds memory (~16 MB of int64) whatever the problem count.
_CHUNK_ENTRIES = 2_000_000


@dataclass(frozen=True)
class Comparison:
    mean_a: float
    mean_b: float
    delta: float  # mean_a - mean_b
    low: float  # percentile interval of delta
    high: float
    verdict: str  # "a", "b" or "tie" (the interval contains 0)
    n_problems: int
    confidence: float
    n_resamples: int


def _per_problem(x, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim not in (1, 2):
        raise ValueError(f"{name} must have shape (problems,) or (problems, samples), got {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite scores")
    return arr if arr.ndim == 1 else arr.mean(axis=1)


def paired_bootstrap(
    a, b, *, n_resamples: int = 10_000, confidence: float = 0.95, seed: int = 0
) -> Comparison:
    """Compare ``a`` and ``b``, scored on the same problems in the same order.

    Each is (problems,) or (problems, samples); samples are averaged within a problem first (a and b
    may have different sample counts). Problems are resampled with replacement, the same indices for
    both, and the interval is the percentile interval of mean(a) - mean(b) at ``confidence``.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if int(n_resamples) != n_resamples or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples}")
    n_resamples = int(n_resamples)
    pa, pb = _per_problem(a, "a"), _per_problem(b, "b")
    if pa.shape != pb.shape:
        raise ValueError(
            f"a and b must score the same problems: a has shape {np.shape(a)}, b has shape {np.shape(b)}"
        )
    # mean(a*) - mean(b*) == mean(d*) for paired resamples, so only d needs resampling.
    d = pa - pb
    n = d.size
    rng = np.random.default_rng(seed)
    stats = np.empty(n_resamples)
    rows = max(1, _CHUNK_ENTRIES // n)
    for start in range(0, n_resamples, rows):
        stop = min(start + rows, n_resamples)
        idx = rng.integers(0, n, size=(stop - start, n))
        stats[start:stop] = d[idx].mean(axis=1)
    alpha = 1 - confidence
    low, high = np.quantile(stats, [alpha / 2, 1 - alpha / 2])
    verdict = "a" if low > 0 else "b" if high < 0 else "tie"
    mean_a, mean_b = float(pa.mean()), float(pb.mean())
    return Comparison(
        mean_a=mean_a,
        mean_b=mean_b,
        delta=mean_a - mean_b,
        low=float(low),
        high=float(high),
        verdict=verdict,
        n_problems=n,
        confidence=float(confidence),
        n_resamples=n_resamples,
    )
