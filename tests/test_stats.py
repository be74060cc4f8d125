import math

import numpy as np
import pytest

from stillroom.stats import Comparison, paired_bootstrap


def test_means_and_delta_on_hand_data():
    a = [1, 0, 1, 1]
    b = [0, 0, 1, 0]
    c = paired_bootstrap(a, b, n_resamples=2000)
    assert isinstance(c, Comparison)
    assert c.mean_a == pytest.approx(0.75)
    assert c.mean_b == pytest.approx(0.25)
    assert c.delta == pytest.approx(0.5)
    assert c.n_problems == 4
    # every resampled mean of d = [1, 0, 0, 1] lies in [0, 1]
    assert 0.0 <= c.low <= c.delta <= c.high <= 1.0


def test_bool_input():
    c = paired_bootstrap(np.array([True, False, True]), np.array([False, False, True]))
    assert c.delta == pytest.approx(1 / 3)


def test_identical_arrays_tie():
    a = np.random.default_rng(1).random(50)
    c = paired_bootstrap(a, a.copy())
    assert c.delta == 0.0
    assert c.low == 0.0 and c.high == 0.0
    assert c.verdict == "tie"


def test_clear_winner_and_loser():
    rng = np.random.default_rng(2)
    good = (rng.random((300, 4)) < 0.8).astype(float)
    bad = (rng.random((300, 4)) < 0.4).astype(float)
    win = paired_bootstrap(good, bad)
    assert win.verdict == "a" and win.low > 0 and win.delta > 0.3
    lose = paired_bootstrap(bad, good)
    assert lose.verdict == "b" and lose.high < 0
    assert lose.delta == pytest.approx(-win.delta)


def test_small_noisy_difference_is_tie():
    rng = np.random.default_rng(3)
    a = (rng.random(40) < 0.5).astype(float)
    b = a.copy()
    b[:2] = 1 - b[:2]  # two differing problems out of 40: often neither is resampled
    c = paired_bootstrap(a, b)
    assert c.low <= 0 <= c.high and c.verdict == "tie"


def test_2d_equals_row_means():
    rng = np.random.default_rng(4)
    a = rng.integers(0, 2, size=(60, 8))
    b = rng.integers(0, 2, size=(60, 8))
    two_d = paired_bootstrap(a, b, seed=7)
    one_d = paired_bootstrap(a.mean(axis=1), b.mean(axis=1), seed=7)
    assert two_d == one_d


def test_different_sample_counts_per_system():
    a = np.ones((5, 16))
    b = np.zeros((5, 4))
    c = paired_bootstrap(a, b)
    assert c.delta == 1.0 and c.verdict == "a"


def test_deterministic_under_seed():
    rng = np.random.default_rng(5)
    a, b = rng.random(200), rng.random(200)
    assert paired_bootstrap(a, b, seed=11) == paired_bootstrap(a, b, seed=11)
    other = paired_bootstrap(a, b, seed=12)
    first = paired_bootstrap(a, b, seed=11)
    assert (other.low, other.high) != (first.low, first.high)
    assert other.delta == first.delta


def test_interval_matches_normal_approximation():
    rng = np.random.default_rng(6)
    n = 2000
    a = (rng.random((n, 4)) < 0.6).mean(axis=1)
    b = (rng.random((n, 4)) < 0.55).mean(axis=1)
    c = paired_bootstrap(a, b, n_resamples=5000)
    d = a - b
    half = 1.96 * d.std(ddof=1) / math.sqrt(n)
    assert c.low == pytest.approx(d.mean() - half, abs=0.15 * half)
    assert c.high == pytest.approx(d.mean() + half, abs=0.15 * half)
    narrower = paired_bootstrap(a, b, n_resamples=5000, confidence=0.5)
    assert c.low < narrower.low < narrower.high < c.high


def test_chunking_covers_many_resamples():
    # more index entries than one chunk holds, so several chunks are drawn
    rng = np.random.default_rng(8)
    a, b = rng.random(1000), rng.random(1000)
    c = paired_bootstrap(a, b, n_resamples=5001)
    assert c.n_resamples == 5001 and c.low < c.delta < c.high


@pytest.mark.parametrize(
    "a, b, kwargs, match",
    [
        ([1, 0, 1], [1, 0], {}, r"\(3,\).*\(2,\)"),
        (np.ones((3, 2)), np.ones((4, 2)), {}, r"\(3, 2\).*\(4, 2\)"),
        ([], [], {}, "empty"),
        (np.ones((3, 0)), np.ones((3, 0)), {}, "empty"),
        ([1.0, float("nan")], [1.0, 0.0], {}, "NaN"),
        ([1.0, 0.0], [float("inf"), 0.0], {}, "NaN or infinite"),
        (np.ones((2, 2, 2)), np.ones((2, 2, 2)), {}, "shape"),
        ([1, 0], [0, 1], {"confidence": 1.0}, "confidence"),
        ([1, 0], [0, 1], {"confidence": 0.0}, "confidence"),
        ([1, 0], [0, 1], {"n_resamples": 0}, "n_resamples"),
        ([1, 0], [0, 1], {"n_resamples": 2.5}, "n_resamples"),
    ],
)
def test_validation(a, b, kwargs, match):
    with pytest.raises(ValueError, match=match):
        paired_bootstrap(a, b, **kwargs)


def test_interval_agrees_with_scipy_percentile_bootstrap():
    """Same estimand as scipy.stats.bootstrap (paired, percentile): intervals agree within resampling noise."""
    from scipy.stats import bootstrap

    rng = np.random.default_rng(11)
    a = (rng.random((400, 4)) < 0.55).astype(float)
    b = (rng.random((400, 4)) < 0.45).astype(float)
    ours = paired_bootstrap(a, b, n_resamples=20_000, seed=1)
    ref = bootstrap((a.mean(1), b.mean(1)), lambda x, y: np.mean(x - y), paired=True, vectorized=False,
                    n_resamples=20_000, method="percentile", random_state=2).confidence_interval
    half = (ours.high - ours.low) / 2
    assert abs(ours.low - ref.low) < 0.05 * half and abs(ours.high - ref.high) < 0.05 * half
