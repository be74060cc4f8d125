"""Code grading cost per program: the candidate and judge processes under bubblewrap vs without it
(rlimits and the audit hook alone), one program after another.

    .venv/bin/python bench/code_grading.py --rounds 5

The mix: the shipped tinycode benchmark's problems with a wrong solution each (a right one for a
few), a HumanEval-style check() making many calls (the cost of a call crossing the pipes), and a
program that crashes on import. The script asserts that both ways grade every program the same,
never anything about time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stillroom import sandbox
from stillroom.grading.code import grade_code, parse_code_gold
from stillroom.io import read_jsonl

REPO = Path(__file__).resolve().parents[1]
# right programs for a few tinycode problems (a wrong one, returning None, for each)
RIGHT = {
    "count_vowels": "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)\n",
    "reverse_words": "def reverse_words(s):\n    return ' '.join(reversed(s.split()))\n",
    "fibonacci": "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n"
    "        a, b = b, a + b\n    return a\n",
    "is_prime": "def is_prime(n):\n"
    "    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n",
}
MANY_CALLS = json.dumps(
    {
        "entry_point": "square",
        "tests": "def check(candidate):\n"
        "    for i in range(500):\n"
        "        assert candidate(i) == i * i\n",
    }
)


def fenced(code: str) -> str:
    return f"```python\n{code}```"


def programs() -> list[tuple[str, str, str]]:
    """(label, response, gold)"""
    items = []
    for row in read_jsonl(str(REPO / "config" / "benchmarks" / "tinycode.jsonl")):
        _, entry = parse_code_gold(row["answer"])
        if entry in RIGHT:
            items.append(("right", fenced(RIGHT[entry]), row["answer"]))
        items.append(("wrong", fenced(f"def {entry}(*a):\n    return None\n"), row["answer"]))
    items.append(("500 calls", fenced("def square(x):\n    return x * x\n"), MANY_CALLS))
    items.append(("crash", fenced("raise RuntimeError('boom')\n"), MANY_CALLS))
    return items


def run(items, rounds: int) -> tuple[list[str], dict[str, list[float]]]:
    """Statuses of the first round, and wall seconds per program by kind."""
    statuses, seconds = [], {}
    for r in range(rounds):
        for label, response, gold in items:
            t0 = time.perf_counter()
            status = grade_code(response, gold, timeout_s=10).status
            seconds.setdefault(label, []).append(time.perf_counter() - t0)
            if r == 0:
                statuses.append(status)
    return statuses, seconds


def median_ms(argv: list[str], n: int = 10) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    items = programs()
    if not sandbox.bwrap_available():
        sys.exit("bubblewrap cannot run here: nothing to compare")
    print(f"{len(items)} programs x {args.rounds} rounds: {dict(Counter(k for k, _, _ in items))}")
    results = {"bubblewrap": run(items, args.rounds)}
    sandbox._BWRAP_OK[False] = False  # as where it cannot run (warned once already: it can here)
    sandbox._BWRAP_WARNED.append(True)
    results["no bubblewrap"] = run(items, args.rounds)
    base = results["bubblewrap"][0]
    print(f"statuses: {dict(Counter(base))}")
    print(f"\n{'mode':<14} {'program kind':<12} {'median ms':>10} {'mean ms':>9}")
    for mode, (statuses, seconds) in results.items():
        assert statuses == base, f"{mode}: statuses differ"
        for label, times in seconds.items():
            print(
                f"{mode:<14} {label:<12} {1000 * statistics.median(times):>10.0f}"
                f" {1000 * statistics.fmean(times):>9.0f}"
            )
        every = [t for times in seconds.values() for t in times]
        print(
            f"{mode:<14} {'all':<12} {1000 * statistics.median(every):>10.0f}"
            f" {1000 * statistics.fmean(every):>9.0f}"
        )
    # for scale: what each of the two processes pays to start, bare and in its sandbox
    python = [sys.executable, "-I", "-S", "-B", "-c", "pass"]
    print(
        f"\nstart-up, median of 10: python -I -S -B {median_ms(python):.0f} ms, the same in bwrap"
        f" {median_ms(sandbox.bwrap(python, cwd='/tmp', readable=[])):.0f} ms, bwrap alone"
        f" {median_ms(sandbox.bwrap(['/bin/true'], cwd='/tmp', readable=[])):.0f} ms"
    )


if __name__ == "__main__":
    main()
