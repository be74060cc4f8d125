"""Paired comparison of two systems scored on the same problems: percentile bootstrap (one- or
two-level) with a bootstrap p-value, Holm's step-down correction across the comparisons of a sweep,
and McNemar's exact test for one binary sample per problem."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# How a comparison's verdict reads in a table row: model "a" against reference "b". "zero": both
# score 0 on every problem, so there is no difference to test (not a tie of two measured rates).
VERDICT = {"a": "better", "b": "worse", "tie": "tie", "zero": "both 0"}

# Index entries generated per chunk: bounds memory (~16 MB of int64) whatever the problem count.
_CHUNK_ENTRIES = 2_000_000


@dataclass(frozen=True)
class Comparison:
    mean_a: float
    mean_b: float
    delta: float  # mean_a - mean_b
    low: float  # percentile interval of delta
    high: float
    # "a", "b", "tie" (the interval contains 0; after holm_comparisons, also not rejected) or
    # "zero" (both score 0 everywhere)
    verdict: str
    n_problems: int
    confidence: float
    n_resamples: int
    # Fields added later keep defaults so that older constructions still work.
    p_value: float | None = None  # two-sided bootstrap p-value for delta != 0
    two_level: bool = False  # samples were also resampled within problems
    p_holm: float | None = None  # Holm-adjusted p-value, set by holm_comparisons


@dataclass(frozen=True)
class McNemar:
    b01: int  # problems where a is wrong (0) and b is right (1)
    b10: int  # problems where a is right (1) and b is wrong (0)
    p_value: float  # exact two-sided binomial test of b10 against Binomial(b01 + b10, 1/2)


def _scores(x, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim not in (1, 2):
        raise ValueError(
            f"{name} must have shape (problems,) or (problems, samples), got {arr.shape}"
        )
    if arr.size == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite scores")
    return arr


def _per_problem(arr: np.ndarray) -> np.ndarray:
    return arr if arr.ndim == 1 else arr.mean(axis=1)


# Binary scores with at most this many samples per problem draw their inner counts from a lookup
# table of (samples + 1) x _TABLE_BINS int8 entries (1 MiB at 64 samples).
_TABLE_MAX_SAMPLES = 64
_TABLE_BINS = 1 << 14


def _inverse_cdf_table(k: int) -> tuple[np.ndarray, np.ndarray]:
    """For s = 0..k successes out of k: the CDF of Binomial(k, s/k), and the count it maps each of
    _TABLE_BINS equal bins of u in [0, 1) to by inversion (count = #{c : cdf[s, c] <= u}), or -1
    where a CDF step falls inside the bin and the count depends on where u lies in it."""
    c = np.arange(k + 1)
    p = c / k
    comb = np.array([math.comb(k, i) for i in c], dtype=np.float64)
    # 0.0**0 == 1
    pmf = comb[None, :] * p[:, None] ** c[None, :] * (1 - p[:, None]) ** (k - c)[None, :]
    cdf = np.cumsum(pmf, axis=1)
    cdf[:, k] = 1.0  # u < 1 always, so the count never exceeds k
    edges = np.arange(_TABLE_BINS + 1) / _TABLE_BINS
    table = np.empty((k + 1, _TABLE_BINS), dtype=np.int8)
    for s in c:
        at_start = np.searchsorted(cdf[s], edges[:-1], side="right")  # #{cdf <= j / L}
        before_end = np.searchsorted(cdf[s], edges[1:], side="left")  # #{cdf < (j + 1) / L}
        table[s] = np.where(at_start == before_end, at_start, -1)
    return cdf, table


class _WithinResampler:
    """Per-problem means after resampling each drawn problem's k samples with replacement.

    Scores that are all 0 or 1 use that k draws with replacement from a problem with s successes
    sum to Binomial(k, s / k): one draw per (resample, problem) instead of k, by inversion through a
    precomputed table for k <= _TABLE_MAX_SAMPLES ("table": one uniform and one lookup, the exact
    CDF only for the rare uniforms that land in a bin holding a CDF step) or by numpy's binomial
    sampler above it ("binomial"). Other scores draw k sample indices per drawn problem and gather
    them ("gather"), in sub-chunks of _CHUNK_ENTRIES. The paths share the distribution, not the
    random stream; ``method`` forces one (binary paths only on binary scores).
    """

    def __init__(self, scores: np.ndarray, rng: np.random.Generator, *, method: str = "auto"):
        self.n, self.k = scores.shape
        self.rng = rng
        self.flat = np.ascontiguousarray(scores).ravel()
        binary = bool(np.all((scores == 0) | (scores == 1)))
        if method == "auto":
            method = (
                "gather" if not binary else "table" if self.k <= _TABLE_MAX_SAMPLES else "binomial"
            )
        if method not in ("table", "binomial", "gather") or (method != "gather" and not binary):
            raise ValueError(f"within-problem method {method!r} does not apply to these scores")
        self.method = method
        successes = scores.sum(axis=1).round().astype(np.int64)
        if method == "binomial":
            self.p = successes / self.k
        elif method == "table":
            self.cdf, table = _inverse_cdf_table(self.k)
            self.table = table.ravel()
            self.successes = successes
        self.dtype = np.int32 if max(scores.size, (self.k + 1) * _TABLE_BINS) < 2**31 else np.int64
        if method == "table":
            # problem i's row in the flat table
            self.row = (successes * _TABLE_BINS).astype(self.dtype)

    def means(self, idx: np.ndarray) -> np.ndarray:
        """Resampled per-problem means, shape idx.shape == (resamples, problems)."""
        if self.k == 1:  # one sample: resampling it changes nothing
            return self.flat[idx]
        if self.method == "binomial":
            return self.rng.binomial(self.k, self.p[idx]) / self.k
        if self.method == "table":
            u = self.rng.random(idx.shape)
            j = (u * _TABLE_BINS).astype(self.dtype)
            j += self.row[idx]
            counts = self.table[j]
            split = np.flatnonzero(counts < 0)
            if split.size:
                cdf = self.cdf[self.successes[idx.ravel()[split]]]
                counts.ravel()[split] = np.count_nonzero(cdf <= u.ravel()[split, None], axis=1)
            return counts / self.k
        out = np.empty(idx.shape)
        rows = max(1, _CHUNK_ENTRIES // (idx.shape[1] * self.k))
        for start in range(0, idx.shape[0], rows):
            stop = min(start + rows, idx.shape[0])
            j = self.rng.integers(
                0, self.k, size=(stop - start, idx.shape[1], self.k), dtype=self.dtype
            )
            j += (idx[start:stop] * self.k).astype(self.dtype)[..., None]
            out[start:stop] = np.take(self.flat, j).sum(axis=-1) / self.k
        return out


def _bootstrap_stats(
    a: np.ndarray, b: np.ndarray, n_resamples: int, seed, two_level: bool, within: str = "auto"
) -> np.ndarray:
    """Resampled mean(a) - mean(b): problems drawn with replacement, the same indices for a and
    b."""
    pa, pb = _per_problem(a), _per_problem(b)
    n = pa.size
    # The problem indices come from default_rng(seed) in the same chunks whether or not two_level
    # is set, so a two-level run on data without within-problem spread equals the one-level run;
    # the within-problem draws use their own streams (one for a, one for b) spawned from the same
    # seed.
    rng = np.random.default_rng(seed)
    if two_level:
        ra, rb = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
        wa = _WithinResampler(a, ra, method=within)
        wb = _WithinResampler(b, rb, method=within)
    else:
        # mean(a*) - mean(b*) == mean(d*) for paired resamples, so only d needs resampling.
        d = pa - pb
    stats = np.empty(n_resamples)
    rows = max(1, _CHUNK_ENTRIES // n)
    for start in range(0, n_resamples, rows):
        stop = min(start + rows, n_resamples)
        idx = rng.integers(0, n, size=(stop - start, n))
        if two_level:
            stats[start:stop] = (wa.means(idx) - wb.means(idx)).mean(axis=1)
        else:
            stats[start:stop] = d[idx].mean(axis=1)
    return stats


def _bootstrap_p(stats: np.ndarray) -> float:
    """Two-sided bootstrap p-value for delta != 0: 2 * min(P*(stat <= 0), P*(stat >= 0)), capped
    at 1.

    Each tail is (count + 1) / (B + 1) (Davison & Hinkley 1997, eq. 4.11), so the p-value is never
    0: B resamples cannot resolve probabilities below about 1 / B, and Holm needs a usable number.
    """
    b = stats.size
    le, ge = int(np.count_nonzero(stats <= 0)), int(np.count_nonzero(stats >= 0))
    return min(1.0, 2 * (min(le, ge) + 1) / (b + 1))


def paired_bootstrap(
    a,
    b,
    *,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
    two_level: bool = False,
) -> Comparison:
    """Compare ``a`` and ``b``, scored on the same problems in the same order.

    Each is (problems,) or (problems, samples); samples are averaged within a problem first (a and
    b may have different sample counts). Problems are resampled with replacement, the same indices
    for both, and the interval is the percentile interval of mean(a) - mean(b) at ``confidence``.
    ``p_value`` is the two-sided bootstrap p-value for a difference (see ``_bootstrap_p``).

    ``two_level=True`` also resamples samples within each drawn problem, with replacement and
    independently for a and for b, so the interval carries the sampling noise of a finite number
    of samples per problem on top of the choice of problems. Both inputs must then be 2-D: a 1-D
    input is an error, because per-problem scores cannot tell "one sample" (where the second level
    changes nothing; pass shape (problems, 1)) from "already averaged" (where it would silently add
    nothing). Sample indices are not paired across a and b, even with equal sample counts: sample j
    of two different systems is two independent generations, and the problem-level pairing already
    carries what they share (the problem's difficulty); independent draws also serve unequal sample
    counts. Resampling at both levels counts the within-problem variance twice (once through the
    spread of the per-problem means, once through the inner draws), so the two-level interval is
    conservative: wider than the one-level one by up to a factor of about sqrt(2) when
    within-problem noise dominates.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if int(n_resamples) != n_resamples or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples}")
    n_resamples = int(n_resamples)
    sa, sb = _scores(a, "a"), _scores(b, "b")
    pa, pb = _per_problem(sa), _per_problem(sb)
    if pa.shape != pb.shape:
        raise ValueError(
            f"a and b must score the same problems: a has shape {np.shape(a)}, "
            f"b has shape {np.shape(b)}"
        )
    if two_level:
        for name, arr in (("a", sa), ("b", sb)):
            if arr.ndim != 2:
                raise ValueError(
                    f"two_level=True resamples samples within problems, so {name} must have shape "
                    f"(problems, samples), got {arr.shape}; pass shape (problems, 1) for one "
                    "sample per problem"
                )
    stats = _bootstrap_stats(sa, sb, n_resamples, seed, bool(two_level))
    alpha = 1 - confidence
    low, high = np.quantile(stats, [alpha / 2, 1 - alpha / 2])
    verdict = "a" if low > 0 else "b" if high < 0 else "tie"
    if not (sa.any() or sb.any()):
        verdict = "zero"
    mean_a, mean_b = float(pa.mean()), float(pb.mean())
    return Comparison(
        mean_a=mean_a,
        mean_b=mean_b,
        delta=mean_a - mean_b,
        low=float(low),
        high=float(high),
        verdict=verdict,
        n_problems=pa.size,
        confidence=float(confidence),
        n_resamples=n_resamples,
        p_value=_bootstrap_p(stats),
        two_level=bool(two_level),
    )


def _check_p_values(p_values: Sequence[float]) -> list[float]:
    ps = []
    for i, p in enumerate(p_values):
        if p is None or not isinstance(p, (int, float, np.integer, np.floating)) or not 0 <= p <= 1:
            raise ValueError(f"p-values must be numbers in [0, 1]; p_values[{i}] is {p!r}")
        ps.append(float(p))
    return ps


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, in the input order.

    With p_(1) <= ... <= p_(m) sorted, the adjusted p_(i) is max over j <= i of
    min(1, (m - j + 1) p_(j)); they are monotone in the raw p-values, and equal raw p-values get
    equal adjusted ones.
    """
    ps = _check_p_values(p_values)
    m = len(ps)
    order = sorted(range(m), key=ps.__getitem__)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def holm(p_values: Sequence[float], alpha: float = 0.05) -> list[bool]:
    """Holm's step-down rejections at family-wise error rate ``alpha``: True where the hypothesis
    is rejected."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    return [p <= alpha for p in holm_adjusted(p_values)]


def holm_comparisons(
    comparisons: Sequence[Comparison], alpha: float | None = None
) -> list[Comparison]:
    """The comparisons of one sweep with Holm's correction applied to their p-values.

    Each returned Comparison has ``p_holm`` set; its verdict is "tie" unless Holm rejects at
    ``alpha`` (default: 1 - confidence, which must then be the same for all) or it is "zero",
    otherwise it keeps its own verdict, so a win needs both the interval to exclude 0 and the
    corrected test to reject.
    Intervals are left as they are (not simultaneous intervals).
    """
    comparisons = list(comparisons)
    for i, c in enumerate(comparisons):
        if c.p_value is None:
            raise ValueError(f"comparisons[{i}] has no p_value (built without paired_bootstrap?)")
    if alpha is None:
        levels = {c.confidence for c in comparisons}
        if len(levels) > 1:
            raise ValueError(
                f"comparisons have different confidence levels {sorted(levels)}; pass alpha"
            )
        alpha = 1 - levels.pop() if levels else 0.05
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    adjusted = holm_adjusted([c.p_value for c in comparisons])
    return [
        dataclasses.replace(
            c, p_holm=p, verdict=c.verdict if p <= alpha or c.verdict == "zero" else "tie"
        )
        for c, p in zip(comparisons, adjusted, strict=True)
    ]


def _binary(x, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise ValueError(
            f"McNemar's test needs one sample per problem: {name} has shape {np.shape(x)}"
        )
    if arr.size == 0:
        raise ValueError(f"{name} is empty (shape {np.shape(x)})")
    try:
        num = arr.astype(np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be binary (0/1 or bool), got dtype {arr.dtype}") from None
    bad = ~((num == 0) | (num == 1))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must be binary (0/1 or bool): {name}[{i}] is {arr[i].item()!r}")
    return num.astype(bool)


def mcnemar_exact(a, b) -> McNemar:
    """McNemar's exact test for paired binary outcomes, one sample per problem.

    ``a`` and ``b`` are (problems,) or (problems, 1) of 0/1 or bools, the same problems in the same
    order. Under "no difference" the discordant problems split evenly, so b10 is tested against
    Binomial(b01 + b10, 1/2), two-sided (scipy.stats.binomtest); with no discordant problem p = 1.
    """
    from scipy.stats import binomtest

    xa, xb = _binary(a, "a"), _binary(b, "b")
    if xa.shape != xb.shape:
        raise ValueError(
            f"a and b must score the same problems: a has shape {np.shape(a)}, "
            f"b has shape {np.shape(b)}"
        )
    b01 = int(np.count_nonzero(~xa & xb))
    b10 = int(np.count_nonzero(xa & ~xb))
    p = 1.0 if b01 + b10 == 0 else float(binomtest(b10, b01 + b10, 0.5).pvalue)
    return McNemar(b01=b01, b10=b10, p_value=min(1.0, p))
