"""Decontamination throughput: NgramIndex vs a naive set of word-tuple n-grams, on a synthetic
prompt pool.

    .venv/bin/python bench/decontam_throughput.py --prompts 100000 --benchmarks 5 --items 500
        --n 13 --seed 0

Prompts are English-like sentences (Zipf-distributed words, numbers, punctuation) of ~20-80 words;
about 1% embed a span of >= n words of a benchmark item (verbatim, upper-cased or re-punctuated) and
0.5% embed only n-1 words (near misses, which must not count). Prints one row per method; the
script asserts that every method finds exactly the same matches as the naive baseline, never
anything about time.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stillroom.data.decontam import NgramIndex, normalize_words

COMMON = """the of and to a in is it that for on was with as be at by this had not are but from or
have an they which one you were her all she there would their we him been has when who will more no
if out so said what up its about into than them can only other new some could time these two may
then do first any my now such like our over man me even most made after also did many before must
through back years where much your way well down should because each just those people how too
little state good very make world still own see men work long get here between both life being under
never day same another know while last might us great old year off come since against go came right
used take three find number value answer sum product total compute solve prove show given let
suppose integer real positive prime function triangle circle area length angle point line
probability random expected equation root square cube digit remainder divisible average ratio
percent speed distance hours minutes apples students books train car water price cost profit rate
interest""".split()


def make_vocab(rng: np.random.Generator, size: int) -> list[str]:
    """Common words first, then pronounceable pseudo-words, so that rank ~ frequency under a Zipf
    draw."""
    onset, vowel = (
        "b c d f g h k l m n p r s t v w z br ch st tr pl".split(),
        "a e i o u ai ea ou".split(),
    )
    coda = [""] * 4 + "n r s t l m".split()
    words = list(dict.fromkeys(COMMON))
    while len(words) < size:
        syl = [
            a + b + c
            for a, b, c in zip(
                *(rng.choice(p, 3 * size).tolist() for p in (onset, vowel, coda)), strict=True
            )
        ]
        lengths = rng.integers(1, 4, size).tolist()
        it = iter(syl)
        words = list(dict.fromkeys(words + ["".join(next(it) for _ in range(k)) for k in lengths]))
    return words[:size]


class Text:
    """Generator of English-like text over a Zipf-weighted vocabulary."""

    def __init__(self, rng: np.random.Generator, vocab_size: int = 20000):
        self.rng = rng
        self.vocab = make_vocab(rng, vocab_size)
        p = 1.0 / np.arange(1, vocab_size + 1) ** 1.05
        self.cdf = np.cumsum(p / p.sum())

    def passage(self, n_words: int) -> str:
        rng = self.rng
        idx = np.minimum(
            np.searchsorted(self.cdf, rng.random(n_words)), len(self.vocab) - 1
        ).tolist()
        kind, punct = rng.random(n_words).tolist(), rng.random(n_words).tolist()
        nums = rng.integers(0, 1000, size=(n_words, 2)).tolist()
        out, sentence_start = [], True
        for i in range(n_words):
            # numbers: integers and decimals
            if kind[i] < 0.03:
                w = str(nums[i][0])
            elif kind[i] < 0.05:
                w = f"{nums[i][0] % 100}.{nums[i][1] % 10}"
            else:
                w = self.vocab[idx[i]]
            out.append(w.capitalize() if sentence_start else w)
            sentence_start = punct[i] < 0.08 or i == n_words - 1
            if sentence_start:
                out[-1] += "?" if punct[i] < 0.01 else "."
            elif punct[i] < 0.14:
                out[-1] += ","
        return " ".join(out)


def perturb(span: str, rng: np.random.Generator) -> str:
    """Same words after normalisation: different case or punctuation."""
    kind = rng.integers(0, 3)
    if kind == 1:
        return span.upper()
    if kind == 2:
        return re.sub(
            r"[ ]+",
            lambda _: rng.choice([" ", ", ", " - ", "; ", "\n"]),
            re.sub(r"[.,?]", "", span),
        )
    return span


def build_pool(args: argparse.Namespace) -> tuple[dict[str, list[str]], list[str]]:
    rng = np.random.default_rng(args.seed)
    gen = Text(rng)
    benchmarks = {
        f"bench{b}": [gen.passage(int(rng.integers(20, 61))) for _ in range(args.items)]
        for b in range(args.benchmarks)
    }
    names = list(benchmarks)
    prompts = []
    for _ in range(args.prompts):
        text = gen.passage(int(rng.integers(20, 81)))
        r = rng.random()
        # embed a benchmark span: >= n words (a hit) or n-1 words (a near miss)
        if r < 0.015:
            words = benchmarks[names[rng.integers(len(names))]][rng.integers(args.items)].split(" ")
            k = int(rng.integers(args.n, len(words) + 1)) if r < 0.01 else args.n - 1
            start = int(rng.integers(0, len(words) - k + 1))
            span = perturb(" ".join(words[start : start + k]), rng)
            cut = int(rng.integers(0, text.count(" ") + 1))
            head, tail = text.split(" ")[:cut], text.split(" ")[cut:]
            text = " ".join([*head, span, *tail])
        prompts.append(text)
    return benchmarks, prompts


class NaiveIndex:
    """Baseline: a dict from word tuples to (benchmark, item) owners, every window looked up in
    Python."""

    def __init__(self, benchmarks, n=13):
        self.grams: dict[tuple[str, ...], set[tuple[str, int]]] = {}
        for name, items in benchmarks.items():
            for item, text in enumerate(items):
                words = normalize_words(text)
                m = min(n, len(words))
                for i in range(len(words) - m + 1 if words else 0):
                    self.grams.setdefault(tuple(words[i : i + m]), set()).add((name, item))
        self.lengths = sorted({len(g) for g in self.grams}, reverse=True)

    def matches(self, text):
        words, grams, found = normalize_words(text), self.grams, set()
        for m in self.lengths:
            for i in range(len(words) - m + 1):
                owners = grams.get(tuple(words[i : i + m]))
                if owners:
                    found.update((b, item, " ".join(words[i : i + m])) for b, item in owners)
        return found


def timed(fn, *args, repeat=1):
    """Result of fn(*args) and its best wall time over ``repeat`` runs."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(*args)
        best = min(best, time.perf_counter() - t0)
    return out, best


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=100000)
    ap.add_argument("--benchmarks", type=int, default=5)
    ap.add_argument("--items", type=int, default=500)
    ap.add_argument("--n", type=int, default=13)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--repeat", type=int, default=3, help="report the best of this many runs of each method"
    )
    args = ap.parse_args(argv)

    (benchmarks, prompts), t_pool = timed(build_pool, args)
    n_words = sum(len(normalize_words(p)) for p in prompts)
    print(
        f"pool: {len(prompts)} prompts, {n_words / len(prompts):.1f} words/prompt, "
        f"{args.benchmarks}x{args.items} benchmark items, n={args.n} (generated in {t_pool:.1f} s)"
    )

    def as_sets(scanned):
        return [{(m.benchmark, m.item, m.ngram) for m in ms} for ms in scanned]

    naive, naive_build = timed(NaiveIndex, benchmarks, args.n, repeat=args.repeat)
    index, build = timed(NgramIndex, benchmarks, args.n, repeat=args.repeat)
    # label, build s, how to scan, scan result -> per-prompt match sets (None: flags only)
    methods = [
        (
            "naive word-tuple set",
            naive_build,
            lambda: [naive.matches(p) for p in prompts],
            lambda f: f,
        ),
        ("NgramIndex.scan", build, lambda: index.scan(prompts), as_sets),
        ("NgramIndex.matches loop", build, lambda: [index.matches(p) for p in prompts], as_sets),
        (
            "NgramIndex.contaminated loop",
            build,
            lambda: [index.contaminated(p) for p in prompts],
            None,
        ),
    ]
    print(
        f"\n{'method':<30} {'build s':>8} {'scan s':>8} {'prompts/s':>10} {'hits':>6} "
        f"{'speedup':>8}"
    )
    for label, b, scan_fn, to_sets in methods:
        found, s = timed(scan_fn, repeat=args.repeat)
        hits = [bool(f) for f in found]
        if label.startswith("naive"):
            naive_found, naive_hits, naive_s = found, hits, s
        assert hits == naive_hits, f"{label}: contaminated prompts differ from the naive baseline"
        assert to_sets is None or to_sets(found) == naive_found, (
            f"{label}: matches differ from the naive baseline"
        )
        print(
            f"{label:<30} {b:>8.3f} {s:>8.3f} {len(prompts) / s:>10.0f} {sum(hits):>6} "
            f"{naive_s / s:>7.1f}x"
        )


if __name__ == "__main__":
    main()
