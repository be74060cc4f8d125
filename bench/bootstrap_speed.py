"""paired_bootstrap wall time on 1,000 problems x 16 binary samples x 10,000 resamples, next to
scipy.stats.bootstrap (percentile, vectorised np.mean) on the per-problem differences: the same
statistic as the one-level paired bootstrap, so the two intervals should agree within resampling
noise.

Rows: paired_bootstrap one-level; two-level (problems, then samples within each drawn problem) on
these 0/1 scores, which draws each inner count from Binomial(k, s/k) through a lookup table; the
same two-level run forced through numpy's binomial sampler (what binary scores with more than 64
samples take) and through the index gather (what non-binary scores take); and
scipy.stats.bootstrap((d,), np.mean, ...). The normal-theory 95% intervals (delta +- 1.96 SE, with
the law-of-total-variance SE for two-level) are printed for reference. Scores: per-problem
difficulty on the logit scale ~ N(0, 1.5); system a gets +0.1 logit plus a per-problem
interaction. Best wall time of --repeat runs. Prints numbers only.

    .venv/bin/python bench/bootstrap_speed.py [--problems 1000] [--samples 16]
        [--resamples 10000] [--repeat 3]
"""

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stillroom.analysis.stats import _bootstrap_stats, paired_bootstrap


def best_of(repeat: int, fn):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--repeat", type=int, default=3, help="report the best of this many runs of each method"
    )
    args = ap.parse_args()

    from scipy.stats import bootstrap

    rng = np.random.default_rng(args.seed)
    n, k, B, conf = args.problems, args.samples, args.resamples, args.confidence
    z = rng.normal(0, 1.5, size=(n, 1))
    pa = 1 / (1 + np.exp(-(z + 0.1 + rng.normal(0, 0.5, size=(n, 1)))))
    pb = 1 / (1 + np.exp(-(z + rng.normal(0, 0.5, size=(n, 1)))))
    a = (rng.random((n, k)) < pa).astype(float)
    b = (rng.random((n, k)) < pb).astype(float)
    d = a.mean(axis=1) - b.mean(axis=1)
    print(
        f"data: {n} problems x {k} samples (0/1), {B} resamples, confidence {conf}, "
        f"{os.cpu_count()} CPUs visible, numpy {np.__version__}"
    )
    print(f"mean a {a.mean():.4f}  mean b {b.mean():.4f}  delta {d.mean():+.5f}")

    q = [(1 - conf) / 2, (1 + conf) / 2]

    def two_level_via(within):
        def run():
            s = _bootstrap_stats(a, b, B, args.seed, True, within=within)
            lo, hi = np.quantile(s, q)
            return lo, hi

        return run

    def scipy_run():
        ci = bootstrap(
            (d,),
            np.mean,
            n_resamples=B,
            confidence_level=conf,
            method="percentile",
            vectorized=True,
            random_state=args.seed,
        ).confidence_interval
        return ci.low, ci.high

    rows = []
    t, c = best_of(
        args.repeat, lambda: paired_bootstrap(a, b, n_resamples=B, confidence=conf, seed=args.seed)
    )
    rows.append(("paired_bootstrap one-level", t, c.low, c.high, f"{c.p_value:.4g}"))
    t, c = best_of(
        args.repeat,
        lambda: paired_bootstrap(
            a, b, n_resamples=B, confidence=conf, seed=args.seed, two_level=True
        ),
    )
    rows.append(("paired_bootstrap two-level", t, c.low, c.high, f"{c.p_value:.4g}"))
    for within in ("binomial", "gather"):
        t, (lo, hi) = best_of(args.repeat, two_level_via(within))
        rows.append((f"two-level, {within} path", t, lo, hi, "-"))
    t_scipy, (lo, hi) = best_of(args.repeat, scipy_run)
    rows.append(("scipy.stats.bootstrap (d,)", t_scipy, lo, hi, "-"))

    zq = (
        1.959963984540054
        if conf == 0.95
        else float(__import__("scipy.stats").stats.norm.ppf((1 + conf) / 2))
    )
    se1 = d.std() / np.sqrt(n)
    se2 = np.sqrt((d.var() + (a.var(1) / k).mean() + (b.var(1) / k).mean()) / n)

    print(
        f"\n{'method':<30} {'seconds':>8} {'vs scipy':>9} {'low':>9} {'high':>9} {'width':>8} "
        f"{'p':>8}"
    )
    for label, t, lo, hi, p in rows:
        print(
            f"{label:<30} {t:>8.3f} {t / t_scipy:>8.2f}x {lo:>+9.5f} {hi:>+9.5f} "
            f"{hi - lo:>8.5f} {p:>8}"
        )
    for label, se in (("normal theory, one-level SE", se1), ("normal theory, two-level SE", se2)):
        lo, hi = d.mean() - zq * se, d.mean() + zq * se
        print(f"{label:<30} {'':>8} {'':>9} {lo:>+9.5f} {hi:>+9.5f} {hi - lo:>8.5f}")


if __name__ == "__main__":
    main()
