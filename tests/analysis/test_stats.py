import dataclasses
import math

import numpy as np
import pytest

from stillroom.analysis.stats import (
    Comparison,
    McNemar,
    _bootstrap_stats,
    _WithinResampler,
    holm,
    holm_adjusted,
    holm_comparisons,
    mcnemar_exact,
    paired_bootstrap,
)


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


def test_both_zero_everywhere_is_no_comparison_not_a_tie():
    zero = np.zeros((20, 2))
    c = paired_bootstrap(zero, zero.copy(), n_resamples=500)
    assert c.verdict == "zero" and c.delta == 0.0 and c.p_value == 1.0
    # Holm leaves it as it is; a tie of measured rates in the same family is still a tie
    other = paired_bootstrap(np.ones(20), np.ones(20), n_resamples=500)
    assert [x.verdict for x in holm_comparisons([c, other])] == ["zero", "tie"]


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
    """Same estimand as scipy.stats.bootstrap (paired, percentile): intervals agree within
    resampling noise."""
    from scipy.stats import bootstrap

    rng = np.random.default_rng(11)
    a = (rng.random((400, 4)) < 0.55).astype(float)
    b = (rng.random((400, 4)) < 0.45).astype(float)
    ours = paired_bootstrap(a, b, n_resamples=20_000, seed=1)
    ref = bootstrap(
        (a.mean(1), b.mean(1)),
        lambda x, y: np.mean(x - y),
        paired=True,
        vectorized=False,
        n_resamples=20_000,
        method="percentile",
        random_state=2,
    ).confidence_interval
    half = (ours.high - ours.low) / 2
    assert abs(ours.low - ref.low) < 0.05 * half and abs(ours.high - ref.high) < 0.05 * half


# --- p-value --------------------------------------------------------------------------------------


def test_comparison_stays_backward_compatible():
    c = Comparison(0.5, 0.25, 0.25, 0.1, 0.4, "a", 10, 0.95, 100)
    assert c.p_value is None and c.p_holm is None and c.two_level is False


def test_p_value_identical_is_one_and_clear_winner_is_floor():
    a = np.random.default_rng(1).random(50)
    assert paired_bootstrap(a, a.copy()).p_value == 1.0
    rng = np.random.default_rng(2)
    good = (rng.random((300, 4)) < 0.8).astype(float)
    bad = (rng.random((300, 4)) < 0.4).astype(float)
    # no resample reaches 0: each tail is (0 + 1) / (B + 1)
    assert paired_bootstrap(good, bad, n_resamples=999).p_value == pytest.approx(2 / 1000)
    assert paired_bootstrap(good, bad, n_resamples=999, two_level=True).p_value == pytest.approx(
        2 / 1000
    )


def test_p_value_symmetric_under_swap():
    rng = np.random.default_rng(3)
    a, b = rng.random(80), rng.random(80) + 0.05
    ab, ba = paired_bootstrap(a, b, seed=4), paired_bootstrap(b, a, seed=4)
    assert ab.p_value == ba.p_value and 0 < ab.p_value < 1
    assert (ab.low, ab.high) == pytest.approx((-ba.high, -ba.low))


# --- two-level bootstrap --------------------------------------------------------------------------


def test_two_level_needs_2d_input():
    with pytest.raises(
        ValueError, match=r"two_level=True .* a must have shape \(problems, samples\), got \(3,\)"
    ):
        paired_bootstrap([1, 0, 1], np.ones((3, 2)), two_level=True)
    with pytest.raises(
        ValueError, match=r"b must have shape \(problems, samples\), got \(3,\).*\(problems, 1\)"
    ):
        paired_bootstrap(np.ones((3, 2)), [1, 0, 1], two_level=True)


def test_two_level_without_within_spread_equals_one_level():
    rng = np.random.default_rng(5)
    # every problem's samples agree, so resampling them changes nothing; problem indices share the
    # stream
    a = np.repeat((rng.random((70, 1)) < 0.6).astype(float), 8, axis=1)
    b = np.repeat((rng.random((70, 1)) < 0.5).astype(float), 3, axis=1)
    one, two = paired_bootstrap(a, b, seed=9), paired_bootstrap(a, b, seed=9, two_level=True)
    assert two.two_level and not one.two_level
    assert (two.low, two.high, two.p_value, two.verdict) == (
        one.low,
        one.high,
        one.p_value,
        one.verdict,
    )
    # one sample per problem, as (problems, 1): the same as the one-level run on the 1-D scores
    x, y = rng.random((70, 1)), rng.random((70, 1))
    assert dataclasses.replace(
        paired_bootstrap(x, y, seed=2, two_level=True), two_level=False
    ) == paired_bootstrap(x[:, 0], y[:, 0], seed=2)


def test_two_level_wider_with_within_problem_noise():
    rng = np.random.default_rng(6)
    p = rng.beta(2, 2, size=(400, 1))  # per-problem difficulty shared by both systems
    a = (rng.random((400, 8)) < p).astype(float)
    b = (rng.random((400, 8)) < p).astype(float)
    one, two = paired_bootstrap(a, b, seed=1), paired_bootstrap(a, b, seed=1, two_level=True)
    assert two.delta == one.delta and two.mean_a == one.mean_a
    # d has no between-problem part here, so the inner draws add about as much variance again
    assert 1.2 < (two.high - two.low) / (one.high - one.low) < 1.6


@pytest.mark.parametrize("binary", [True, False])
def test_two_level_variance_matches_law_of_total_variance(binary):
    """Var* = [var_i(d_i) + mean_i(s2_a,i / k_a) + mean_i(s2_b,i / k_b)] / n, with biased within
    variances."""
    rng = np.random.default_rng(7)
    n = 1000
    if binary:
        a = (rng.random((n, 8)) < rng.random((n, 1))).astype(float)
        b = (rng.random((n, 3)) < 0.5).astype(float)
    else:
        a = rng.random((n, 4)) * rng.random((n, 1))
        b = rng.random((n, 6))
    var = (
        np.var(a.mean(1) - b.mean(1))
        + (a.var(1) / a.shape[1]).mean()
        + (b.var(1) / b.shape[1]).mean()
    ) / n
    stats = _bootstrap_stats(a, b, 4000, 3, True)
    assert stats.std() == pytest.approx(math.sqrt(var), rel=0.05)
    assert stats.mean() == pytest.approx(a.mean() - b.mean(), abs=0.1 * math.sqrt(var))
    c = paired_bootstrap(a, b, n_resamples=4000, seed=3, two_level=True)
    half = 1.96 * math.sqrt(var)
    assert c.low == pytest.approx(c.delta - half, abs=0.1 * half)
    assert c.high == pytest.approx(c.delta + half, abs=0.1 * half)


@pytest.mark.parametrize("within", ["binomial", "gather"])
def test_two_level_binary_shortcut_matches_other_paths(within):
    rng = np.random.default_rng(8)
    a = (rng.random((500, 16)) < rng.random((500, 1))).astype(float)
    b = (rng.random((500, 16)) < rng.random((500, 1))).astype(float)
    fast = _bootstrap_stats(a, b, 3000, 0, True)  # the lookup table
    other = _bootstrap_stats(a, b, 3000, 0, True, within=within)
    assert fast.std() == pytest.approx(other.std(), rel=0.08)
    assert np.quantile(fast, [0.025, 0.975]) == pytest.approx(
        np.quantile(other, [0.025, 0.975]), abs=0.15 * other.std()
    )


@pytest.mark.parametrize("k", [2, 5, 16, 64])
def test_inverse_cdf_table_is_exact_inversion(k):
    """The table path gives exactly #{c : CDF(c) <= u} for its uniforms, bins holding a CDF step
    included, and its counts follow Binomial(k, s/k) for every s."""
    from scipy.stats import binom, chisquare

    scores = np.zeros((k + 1, k))
    for s in range(k + 1):
        scores[s, :s] = 1  # problem s has s successes
    w = _WithinResampler(scores, np.random.default_rng(1))
    assert w.method == "table"
    idx = np.random.default_rng(0).integers(0, k + 1, size=(4000, k + 1))
    counts = np.rint(w.means(idx) * k).astype(int)
    u = np.random.default_rng(1).random(idx.shape)
    exact = np.count_nonzero(w.cdf[idx] <= u[..., None], axis=-1)
    assert np.array_equal(counts, exact)
    assert np.all(counts[idx == 0] == 0) and np.all(counts[idx == k] == k)
    for s in range(1, k):
        got = np.bincount(counts[idx == s], minlength=k + 1)
        expected = binom.pmf(np.arange(k + 1), k, s / k) * got.sum()
        keep = expected > 5  # pool the sparse tails
        obs = np.append(got[keep], got[~keep].sum())
        exp = np.append(expected[keep], expected[~keep].sum())
        assert chisquare(obs[exp > 0], exp[exp > 0] * obs.sum() / exp.sum()).pvalue > 1e-4


def test_within_method_must_fit_the_scores():
    with pytest.raises(ValueError, match="'table' does not apply"):
        _WithinResampler(np.full((3, 4), 0.5), np.random.default_rng(0), method="table")
    assert _WithinResampler(np.ones((3, 65)), np.random.default_rng(0)).method == "binomial"
    assert _WithinResampler(np.full((3, 4), 0.5), np.random.default_rng(0)).method == "gather"


def test_two_level_deterministic_under_seed():
    rng = np.random.default_rng(9)
    a, b = rng.random((100, 4)), (rng.random((100, 5)) < 0.5)
    first = paired_bootstrap(a, b, seed=11, two_level=True)
    assert first == paired_bootstrap(a, b, seed=11, two_level=True)
    other = paired_bootstrap(a, b, seed=12, two_level=True)
    assert (other.low, other.high) != (first.low, first.high) and other.delta == first.delta


def test_two_level_chunks_problem_and_sample_draws():
    # 1000 problems: 2000 resamples per problem chunk, 125 per gather sub-chunk at 16 samples
    rng = np.random.default_rng(10)
    a, b = rng.random((1000, 16)), rng.random((1000, 16))
    c = paired_bootstrap(a, b, n_resamples=2101, two_level=True)
    assert c.n_resamples == 2101 and c.low < c.delta < c.high


def test_coverage_under_the_null():
    """200 simulated datasets with true delta 0: the one-level 95% interval covers 0 about 95% of
    the time; the two-level one covers at least as often (it is conservative by construction)."""
    rng = np.random.default_rng(12)
    reps, cover_one, cover_two, agree = 200, 0, 0, 0
    for r in range(reps):
        p = rng.beta(0.5, 0.5, size=(50, 1))
        a = (rng.random((50, 4)) < p).astype(float)
        b = (rng.random((50, 4)) < p).astype(float)
        one = paired_bootstrap(a, b, n_resamples=1000, seed=r)
        two = paired_bootstrap(a, b, n_resamples=1000, seed=r, two_level=True)
        cover_one += one.low <= 0 <= one.high
        cover_two += two.low <= 0 <= two.high
        agree += (one.p_value <= 0.05) == (one.verdict != "tie")
    assert 0.91 <= cover_one / reps <= 0.99
    assert cover_two >= cover_one and cover_two / reps >= 0.95
    assert agree / reps >= 0.97  # the p-value and the interval tell the same story


# --- Holm -----------------------------------------------------------------------------------------


def test_holm_hand_example():
    # sorted 0.005, 0.01, 0.03, 0.04 -> 4*0.005, 3*0.01, 2*0.03, max(1*0.04, 0.06)
    p = [0.01, 0.04, 0.03, 0.005]
    assert holm_adjusted(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm(p) == [True, False, False, True]
    assert holm(p, alpha=0.1) == [True, True, True, True]
    assert holm(p, alpha=0.025) == [False, False, False, True]


def test_holm_caps_ties_and_edges():
    assert holm_adjusted([0.5, 0.9, 0.02]) == pytest.approx([1.0, 1.0, 0.06])
    assert holm_adjusted([0.02, 0.02, 0.5]) == pytest.approx([0.06, 0.06, 0.5])
    assert holm_adjusted([0.04]) == [0.04] and holm([0.04]) == [True]
    assert holm_adjusted([]) == [] and holm([]) == []
    rng = np.random.default_rng(13)
    raw = rng.random(30) ** 3
    adj = np.array(holm_adjusted(raw))
    order = np.argsort(raw)
    assert np.all(np.diff(adj[order]) >= 0) and np.all(adj >= raw) and np.all(adj <= 1)


@pytest.mark.parametrize(
    "p, match",
    [
        ([0.1, 1.5], r"p_values\[1\] is 1.5"),
        ([float("nan")], r"p_values\[0\] is nan"),
        ([0.1, None], r"p_values\[1\] is None"),
        ([-0.01], r"p_values\[0\]"),
    ],
)
def test_holm_rejects_bad_p_values(p, match):
    with pytest.raises(ValueError, match=match):
        holm_adjusted(p)


def test_holm_rejects_bad_alpha():
    with pytest.raises(ValueError, match="alpha"):
        holm([0.1], alpha=1.0)


def _comparison(p, verdict, confidence=0.95):
    return Comparison(0.5, 0.4, 0.1, 0.01, 0.2, verdict, 100, confidence, 1000, p_value=p)


def test_holm_comparisons_demotes_what_the_correction_no_longer_rejects():
    cs = [
        _comparison(0.01, "a"),
        _comparison(0.04, "b"),
        _comparison(0.03, "a"),
        _comparison(0.005, "tie"),
    ]
    out = holm_comparisons(cs)
    assert [c.p_holm for c in out] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [c.verdict for c in out] == [
        "a",
        "tie",
        "tie",
        "tie",
    ]  # a rejection keeps the interval's verdict
    assert [c.p_value for c in out] == [0.01, 0.04, 0.03, 0.005] and cs[
        1
    ].verdict == "b"  # inputs untouched
    # alpha defaults to 1 - confidence
    assert [
        c.verdict
        for c in holm_comparisons([_comparison(0.04, "a", 0.9), _comparison(0.05, "a", 0.9)])
    ] == ["a", "a"]
    assert [c.verdict for c in holm_comparisons(cs, alpha=0.1)] == ["a", "b", "a", "tie"]
    assert holm_comparisons([]) == []


def test_holm_comparisons_on_real_bootstraps():
    rng = np.random.default_rng(14)
    base = (rng.random((300, 4)) < 0.5).astype(float)
    models = [(rng.random((300, 4)) < q).astype(float) for q in (0.8, 0.5, 0.52)]
    out = holm_comparisons([paired_bootstrap(m, base, n_resamples=2000) for m in models])
    assert out[0].verdict == "a" and out[0].p_holm == pytest.approx(3 * 2 / 2001)
    assert out[1].verdict == "tie" and all(c.p_holm >= c.p_value for c in out)


def test_holm_comparisons_errors():
    with pytest.raises(ValueError, match=r"comparisons\[1\] has no p_value"):
        holm_comparisons(
            [_comparison(0.01, "a"), Comparison(0.5, 0.4, 0.1, 0.0, 0.2, "a", 10, 0.95, 100)]
        )
    with pytest.raises(ValueError, match="different confidence levels"):
        holm_comparisons([_comparison(0.01, "a", 0.95), _comparison(0.01, "a", 0.9)])


# --- McNemar --------------------------------------------------------------------------------------


def _pairs(b01, b10, both=5, neither=3):
    a = [0] * b01 + [1] * b10 + [1] * both + [0] * neither
    b = [1] * b01 + [0] * b10 + [1] * both + [0] * neither
    return a, b


@pytest.mark.parametrize(
    "b01, b10, p",
    [
        (1, 9, 22 / 1024),
        (9, 1, 22 / 1024),
        (0, 6, 2 / 64),
        (5, 5, 1.0),
        (0, 0, 1.0),
        (0, 1, 1.0),
        (3, 12, 0.03515625),
    ],
)
def test_mcnemar_known_values(b01, b10, p):
    a, b = _pairs(b01, b10)
    m = mcnemar_exact(a, b)
    assert isinstance(m, McNemar) and (m.b01, m.b10) == (b01, b10)
    assert m.p_value == pytest.approx(p, rel=1e-9)


def test_mcnemar_accepts_bools_and_one_sample_columns():
    a, b = _pairs(1, 9)
    m = mcnemar_exact(np.array(a, dtype=bool)[:, None], np.array(b, dtype=float)[:, None])
    assert (m.b01, m.b10) == (1, 9) and m.p_value == pytest.approx(0.021484375)


@pytest.mark.parametrize(
    "a, b, match",
    [
        ([0, 1, 0.5], [0, 1, 1], r"a must be binary .*a\[2\] is 0.5"),
        ([0, 1, 1], [0, 2, 1], r"b must be binary .*b\[1\] is 2"),
        ([0, 1, float("nan")], [0, 1, 1], r"a\[2\] is nan"),
        ([0, 1, 1], [0, 1], r"same problems.*\(3,\).*\(2,\)"),
        (np.ones((3, 2)), np.ones((3, 2)), r"one sample per problem: a has shape \(3, 2\)"),
        ([], [], "empty"),
        (["x", "y"], [0, 1], "binary"),
    ],
)
def test_mcnemar_errors(a, b, match):
    with pytest.raises(ValueError, match=match):
        mcnemar_exact(a, b)
