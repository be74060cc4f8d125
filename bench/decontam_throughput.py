"""Decontamination throughput: NgramIndex vs a naive set of word-tuple n-grams, on a synthetic prompt pool.

    .venv/bin/python bench/decontam_throughput.py --prompts 100000 --benchmarks 5 --items 500 --n 13 --seed 0

Prompts are English-like sentences (Zipf-distributed words, numbers, punctuation) of ~20-80 words; about 1% embed
a span of >= n words of a benchmark item (verbatim, upper-cased or re-punctuated) and 0.5% embed only n-1 words
(near misses, which must not count). Prints one row per method; the script asserts that every method finds
exactly the same matches as the naive baseline, never anything about time.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stillroom.decontam import NgramIndex, normalize_words  # noqa: E402

COMMON = """the of and to a in is it that for on was with as be at by this had not are but from or have an they
which one you were her all she there would their we him been has when who will more no if out so said what up
its about into than them can only other new some could time these two may then do first any my now such like our
over man me even most made after also did many before must through back years where much your way well down
should because each just those people how too little state good very make world still own see men work long get
here between both life being under never day same another know while last might us great old year off come since
against go came right used take three find number value answer sum product total compute solve prove show given
let suppose integer real positive prime function triangle circle area length angle point line probability
random expected equation root square cube digit remainder divisible average ratio percent speed distance hours
minutes apples students books train car water price cost profit rate interest""".split()


def make_vocab(rng: np.random.Generator, size: int) -> list[str]:
    """Common words first, then pronounceable pseudo-words, so that rank ~ frequency under a Zipf draw."""
    onset, vowel, coda = "b c d f g h k l m n p r s t v w z br ch st tr pl".split(), "a e i o u ai ea ou".split(), [""] * 4 + "n r s t l m".split()
    words = list(dict.fromkeys(COMMON))
    seen = set(words)
    while len(words) < size:
        w = "".join(rng.choice(onset) + rng.choice(vowel) + rng.choice(coda) for _ in range(rng.integers(1, 4)))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


class Text:
    """Generator of English-like text over a Zipf-weighted vocabulary."""

    def __init__(self, rng: np.random.Generator, vocab_size: int = 20000):
        self.rng = rng
        self.vocab = make_vocab(rng, vocab_size)
        p = 1.0 / np.arange(1, vocab_size + 1) ** 1.05
        self.cdf = np.cumsum(p / p.sum())

    def word(self, idx: int) -> str:
        r = self.rng.random()
        if r < 0.05:  # numbers: integers, decimals, thousands
            return str(self.rng.integers(0, 1000)) if r < 0.03 else f"{self.rng.integers(0, 100)}.{self.rng.integers(0, 10)}"
        return self.vocab[idx]

    def passage(self, n_words: int) -> str:
        idx = np.searchsorted(self.cdf, self.rng.random(n_words))
        out, sentence_start = [], True
        for i, k in enumerate(idx.tolist()):
            w = self.word(k)
            out.append(w.capitalize() if sentence_start else w)
            sentence_start = False
            r = self.rng.random()
            if r < 0.08 or i == n_words - 1:
                out[-1] += "?" if r < 0.01 else "."
                sentence_start = True
            elif r < 0.14:
                out[-1] += ","
        return " ".join(out)


def perturb(span: str, rng: np.random.Generator) -> str:
    """Same words after normalisation: different case or punctuation."""
    kind = rng.integers(0, 3)
    if kind == 1:
        return span.upper()
    if kind == 2:
        return re.sub(r"[ ]+", lambda _: rng.choice([" ", ", ", " - ", "; ", "\n"]), re.sub(r"[.,?]", "", span))
    return span


def build_pool(args: argparse.Namespace) -> tuple[dict[str, list[str]], list[str]]:
    rng = np.random.default_rng(args.seed)
    gen = Text(rng)
    benchmarks = {
        f"bench{b}": [gen.passage(int(rng.integers(20, 61))) for _ in range(args.items)] for b in range(args.benchmarks)
    }
    names = list(benchmarks)
    prompts = []
    for _ in range(args.prompts):
        text = gen.passage(int(rng.integers(20, 81)))
        r = rng.random()
        if r < 0.015:  # embed a benchmark span: >= n words (a hit) or n-1 words (a near miss)
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
    """Baseline: a dict from word tuples to (benchmark, item) owners, every window looked up in Python."""

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


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=100000)
    ap.add_argument("--benchmarks", type=int, default=5)
    ap.add_argument("--items", type=int, default=500)
    ap.add_argument("--n", type=int, default=13)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    (benchmarks, prompts), t_pool = timed(build_pool, args)
    n_words = sum(len(normalize_words(p)) for p in prompts)
    print(f"pool: {len(prompts)} prompts, {n_words / len(prompts):.1f} words/prompt, "
          f"{args.benchmarks}x{args.items} benchmark items, n={args.n} (generated in {t_pool:.1f} s)")

    naive, naive_build = timed(NaiveIndex, benchmarks, args.n)
    naive_found, naive_scan = timed(lambda: [naive.matches(p) for p in prompts])
    index, build = timed(NgramIndex, benchmarks, args.n)
    rows = [("naive word-tuple set", naive_build, naive_scan, naive_found)]
    for label, fn in [
        ("NgramIndex.scan", lambda: index.scan(prompts)),
        ("NgramIndex.matches loop", lambda: [index.matches(p) for p in prompts]),
    ]:
        found, scan = timed(fn)
        rows.append((label, build, scan, [{(m.benchmark, m.item, m.ngram) for m in ms} for ms in found]))
    flags, scan = timed(lambda: [index.contaminated(p) for p in prompts])
    rows.append(("NgramIndex.contaminated loop", build, scan, flags))

    naive_hits = [bool(f) for f in naive_found]
    print(f"\n{'method':<30} {'build s':>8} {'scan s':>8} {'prompts/s':>10} {'hits':>6} {'speedup':>8}")
    for label, b, s, found in rows:
        hits = [bool(f) for f in found]
        assert hits == naive_hits, f"{label}: contaminated prompts differ from the naive baseline"
        assert isinstance(found[0], bool) or found == naive_found, f"{label}: matches differ from the naive baseline"
        print(f"{label:<30} {b:>8.3f} {s:>8.3f} {len(prompts) / s:>10.0f} {sum(hits):>6} {naive_scan / s:>7.1f}x")


if __name__ == "__main__":
    main()
