"""Grading throughput: grade_many in this process vs 1 and 2 killable worker processes, on a
realistic mix.

    .venv/bin/python bench/grading_throughput.py --items 2000 --seed 0

The mix imitates graded teacher/eval samples: chain-of-thought text (half inside <think>, half
plain) ending in a boxed integer, fraction or LaTeX expression, right or wrong; answers stated
without a box; junk and truncated responses; a few unparseable golds; and multiple choice over
A-J. ``--hung N`` adds N answers that hang math-verify (each costs the full timeout: a killed and
replaced worker, or math-verify's own alarm in-process). Pool timings include starting the workers
but not the one-off forkserver start, printed apart. The script asserts that every method grades
every item the same, never anything about time.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

import sympy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stillroom.grading import math as math_grader
from stillroom.grading.result import TIMEOUT_S
from stillroom.grading.workers import grade_many

WORDS = """we first note that the sum of both sides gives so the total is then since each term
is positive and by symmetry the remaining case follows substituting back we get therefore hence
consider the equation let us check the boundary which means the value must be""".split()
# (gold, equivalent answers, wrong answers)
EXPRESSIONS = [
    (r"3\sqrt{3}", [r"3\sqrt{3}", r"\sqrt{27}"], [r"3\sqrt{2}", "3"]),
    (r"\frac{\pi}{4}", [r"\frac{\pi}{4}", r"\frac{1}{4}\pi"], [r"\frac{\pi}{2}", r"\pi"]),
    ("x^2 + 2x + 1", ["(x+1)^2", "x^2+2x+1"], ["(x-1)^2", "x^2+1"]),
    ("(1, 3]", ["(1,3]"], ["[1,3]", "(1,3)"]),
    (r"2\sqrt{2} + 1", [r"1 + 2\sqrt{2}"], [r"2\sqrt{2} - 1"]),
    (r"\{1, 2, 3\}", [r"\{3, 2, 1\}"], [r"\{1, 2\}"]),
    ("2, 3", ["3, 2", "2,3"], ["2", "2, 4"]),
    (r"\frac{3}{4}", [r"\dfrac{3}{4}", "0.75", r"\frac{6}{8}"], [r"\frac{4}{3}", "0.7"]),
]
CHOICE_FORMS = [
    "The answer is ({})",
    r"so $\boxed{{{}}}$",
    "**Answer:** {}",
    "Final answer: ({})",
    "ANSWER IS {}",
]


def cot(rng: random.Random) -> str:
    """Reasoning text: words with inline math, 300-2000 characters."""
    out, n = [], rng.randint(300, 2000)
    while sum(len(w) + 1 for w in out) < n:
        r = rng.random()
        if r < 0.08:
            out.append(
                f"${rng.randint(2, 99)} \\times {rng.randint(2, 99)} = {rng.randint(4, 9801)}$"
            )
        elif r < 0.12:
            out.append(f"$\\frac{{{rng.randint(1, 20)}}}{{{rng.randint(2, 20)}}}$")
        else:
            out.append(rng.choice(WORDS))
    return " ".join(out)


def wrap(rng: random.Random, final: str) -> str:
    return f"<think>{cot(rng)}</think>\n{final}" if rng.random() < 0.5 else f"{cot(rng)}\n\n{final}"


def make_items(n: int, hung: int, seed: int) -> tuple[list[tuple[str, str, str]], Counter]:
    rng, items, mix = random.Random(seed), [], Counter()
    cats = (
        ["int_right"] * 30
        + ["int_wrong"] * 12
        + ["frac"] * 8
        + ["expr"] * 10
        + ["unboxed"] * 5
        + ["junk"] * 5
        + ["unclosed_think"] * 2
        + ["gold_bad"] * 1
        + ["choice"] * 27
    )
    for _ in range(n):
        cat = rng.choice(cats)
        mix[cat] += 1
        if cat in ("int_right", "int_wrong"):
            gold = rng.randint(0, 10 ** rng.randint(1, 6))
            ans = gold if cat == "int_right" else gold + rng.choice([-2, -1, 1, 10])
            items.append(
                (wrap(rng, f"Therefore the answer is $\\boxed{{{ans}}}$."), str(gold), "math")
            )
        elif cat == "frac":
            a, b = rng.randint(1, 30), rng.randint(2, 30)
            ans = rf"\frac{{{a}}}{{{b}}}" if rng.random() < 0.7 else rf"\frac{{{a + 1}}}{{{b}}}"
            gold = rf"\frac{{{a}}}{{{b}}}" if rng.random() < 0.5 else f"{a / b:.6g}"
            items.append((wrap(rng, f"The final answer is $\\boxed{{{ans}}}$"), gold, "math"))
        elif cat == "expr":
            gold, same, wrong = rng.choice(EXPRESSIONS)
            ans = rng.choice(same if rng.random() < 0.6 else wrong)
            items.append((wrap(rng, f"So we obtain \\boxed{{{ans}}}."), gold, "math"))
        elif cat == "unboxed":
            gold = rng.randint(0, 999)
            items.append(
                (wrap(rng, f"The answer is {gold + rng.choice([0, 0, 1])}."), str(gold), "math")
            )
        elif cat == "junk":
            junk = rng.choice(
                [
                    cot(rng)[:400] + " so we get \\boxed{",
                    "I'm not sure how to solve this.",
                    "",
                    "#" * 50 + " ???",
                    cot(rng) + " \\begin{align} x &= \\\\ \\end",
                ]
            )
            items.append((junk, str(rng.randint(0, 99)), "math"))
        elif cat == "unclosed_think":
            items.append((f"<think>{cot(rng)} maybe \\boxed{{4}}", "4", "math"))
        elif cat == "gold_bad":
            items.append(
                (
                    wrap(rng, "\\boxed{5}"),
                    rng.choice(["", "see solution"]),
                    rng.choice(["math", "choice"]),
                )
            )
        else:
            # multiple choice: four options or ten (MMLU-Pro style)
            letters = "ABCD" if rng.random() < 0.6 else "ABCDEFGHIJ"
            gold = rng.choice(letters)
            pick = gold if rng.random() < 0.6 else rng.choice(letters)
            items.append((wrap(rng, rng.choice(CHOICE_FORMS).format(pick)), gold, "choice"))
    for _ in range(hung):
        items.insert(rng.randrange(len(items) + 1), (r"\boxed{9^{9^{9^{9}}}}", "7", "math"))
    mix["hung"] = hung
    return items, mix


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument(
        "--hung", type=int, default=0, help="answers that hang math-verify, added to the mix"
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=TIMEOUT_S,
        help="hard per-item limit in workers (s)",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    items, mix = make_items(args.items, args.hung, args.seed)
    chars = sum(len(r) for r, _, _ in items) / len(items)
    print(
        f"mix: {len(items)} items, {chars:.0f} chars/response: "
        + ", ".join(f"{k} {v}" for k, v in mix.items())
    )
    t0 = time.perf_counter()
    grade_many(items[:1], workers=1)
    print(f"forkserver start (once per process): {time.perf_counter() - t0:.2f} s")
    # Warm this process's parsers too (workers warm up before taking items), on items not timed
    # below.
    grade_many(make_items(50, 0, args.seed + 1)[0], workers=0, letters="ABCDEFGHIJ")

    letters = "ABCDEFGHIJ"
    methods = [("in-process (workers=0)", 0), ("1 worker process", 1), ("2 worker processes", 2)]
    print(f"\n{'method':<24} {'wall s':>8} {'items/s':>8} {'speedup':>8}")
    for label, workers in methods:
        # workers start with cold caches; so does the baseline
        math_grader._parse_gold.cache_clear()
        sympy.core.cache.clear_cache()
        t0 = time.perf_counter()
        got = grade_many(items, workers=workers, letters=letters, timeout_s=args.timeout)
        s = time.perf_counter() - t0
        if workers == 0:
            base, base_s = [(g.correct, g.status) for g in got], s
            status = Counter(g.status for g in got)
        assert [(g.correct, g.status) for g in got] == base, (
            f"{label}: grades differ from in-process"
        )
        print(f"{label:<24} {s:>8.2f} {len(items) / s:>8.1f} {base_s / s:>7.2f}x")
    print(f"\ngrades: correct {sum(c for c, _ in base)}, status {dict(status)}")


if __name__ == "__main__":
    main()
