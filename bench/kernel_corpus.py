"""The corpus table of issue 41: every honest real-world kernel of tests/kernels/corpus evaluated
as tests/kernels/test_corpus.py evaluates it (the fast slice with GRPO's default options, the rest
with one trial and the odd-shape case), one markdown row each: entry, kind, origin, problem,
reward, status, the first reason when it earned 0, and what the corpus expects (1, or the phrase
of a listed refusal). Then the libraries that cannot import without a GPU, the totals and the
wall time.

    TRITON_INTERPRET=1 python bench/kernel_corpus.py [--only SUBSTRING] [--workers 1]
        [--json results/kernel_corpus.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _row(entry, options, expected) -> dict:
    from stillroom.kernels import evaluate
    from tests.kernels.corpus import problem_source

    start = time.perf_counter()
    r = evaluate(problem_source(entry.problem), entry.candidate, **options)
    met = r.reward == 1 if expected is None else any(expected in x for x in r.reasons)
    return {
        "name": entry.name,
        "kind": entry.kind,
        "origin": entry.origin,
        "problem": entry.problem,
        "reward": r.reward,
        "status": r.status,
        "reason": "" if r.reward == 1 else (r.reasons[0] if r.reasons else ""),
        "expected": "1" if expected is None else f"0: {expected}",
        "as_expected": met,
        "seconds": round(time.perf_counter() - start, 1),
    }


def _cell(text: str, width: int = 160) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= width else text[: width - 1] + "…"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="entries whose name contains this")
    parser.add_argument("--workers", type=int, default=1, help="evaluations at once")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.path.insert(0, str(REPO))
    from tests.kernels.corpus import ENTRIES, NEEDS_A_GPU, expected_reason, options

    entries = [e for e in ENTRIES if args.only in e.name]
    start = time.perf_counter()
    with ThreadPoolExecutor(args.workers) as pool:
        rows = list(pool.map(lambda e: _row(e, options(e.name), expected_reason(e.name)), entries))
    wall = time.perf_counter() - start
    print("| entry | kind | origin | problem | reward | status | reason (when 0) | expected |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [r["name"], r["kind"], r["origin"], r["problem"], f"{r['reward']:g}", r["status"]]
        cells += [r["reason"], r["expected"] + ("" if r["as_expected"] else " (NOT MET)")]
        print("| " + " | ".join(_cell(c) for c in cells) + " |")
    print("\n| library | without a GPU |\n|---|---|")
    for library, error in NEEDS_A_GPU.items():
        print(f"| {library} | {_cell(error, 300)} |")
    earned = sum(r["reward"] == 1 for r in rows)
    met = sum(r["as_expected"] for r in rows)
    problems = len({r["problem"] for r in rows})
    print(
        f"\n{len(rows)} kernels over {problems} problems: {earned} earned 1, "
        f"{len(rows) - earned} earned 0; {met} as the corpus expects; "
        f"{wall:.0f} s wall with {args.workers} worker(s), load average {os.getloadavg()[0]:.1f}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "wall_s": wall}, indent=1))
    return 0 if met == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
