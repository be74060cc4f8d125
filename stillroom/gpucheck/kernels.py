"""Check ``kernels``: every reference solution compiled by Triton on the GPU through the
kernel reward, with its speedup over the PyTorch reference; then the honest real-world corpus
(tests/kernels/corpus of the checkout this package runs from: library kernels, Inductor-style,
tutorials ...), each entry compiled and replayed on the GPU and held to what it earns on CPU."""

from __future__ import annotations

import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .common import Log, verdict


def check_kernels(
    problems: list[str] | None = None,
    *,
    device: str,
    trials: int,
    timeout_s: float,
    workers: int,
    budget_s: float | None = None,
    corpus: list[str] | None = None,
    log: Log = print,
) -> dict[str, Any]:
    """Every reference solution answered as the procedural teacher answers (reasoning, then the
    code block) and scored by the kernel reward: compiled by Triton on a GPU (its interpreter on
    CPU), checked against the reference and, on a GPU, timed against it. Problems not started
    within ``budget_s`` are reported as not run. ``corpus``: the corpus entries replayed after
    them (None: every one, when the checkout has the corpus)."""
    from ..config import ValidatorOptions
    from ..grading.kernel import score_answer
    from ..kernels.problemset import kernel_files, solution_files
    from ..teachers.kernel import kernel_solution

    spec = {
        "name": "gpu-check",
        "kind": "kernels",
        "problems": list(problems) if problems else None,
    }
    files, solutions = kernel_files(spec), solution_files(spec)
    deadline = time.monotonic() + budget_s if budget_s else math.inf
    results: dict[str, dict] = {}

    def one(stem: str) -> None:
        left = deadline - time.monotonic()
        if stem not in solutions:
            results[stem] = {"reward": 0.0, "reasons": ["no reference solution"]}
            return
        if left < 5:
            results[stem] = {"reward": None, "reasons": ["not run: the check's time was up"]}
            return
        src = files[stem].read_text(encoding="utf-8")
        reasoning, block = kernel_solution(src, stem, detail=0)
        # the candidate's two jobs (extraction, replay) never outlast the check
        options = ValidatorOptions(device=device, trials=trials, timeout_s=min(timeout_s, left / 2))
        start = time.perf_counter()
        try:
            r = score_answer(src, f"<think>\n{reasoning}\n</think>\n\n{block}", options)
        except Exception as exc:  # noqa: BLE001 - the validator itself failed: this problem's result
            results[stem] = {"reward": 0.0, "reasons": [f"{type(exc).__name__}: {exc}"]}
            return
        results[stem] = {
            "reward": r.reward,
            "speedup": round(r.speedup, 3) if r.speedup is not None else None,
            "seconds": round(time.perf_counter() - start, 2),
            **({} if r.reward == 1.0 else {"reasons": r.reasons}),
        }
        log(f"{stem}: reward {r.reward:g}, speedup {results[stem]['speedup']}")

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, files))
    replayed = replay_corpus(corpus, device, trials, timeout_s, workers, deadline, log)
    per_problem = {stem: results[stem] for stem in files}
    passed = [s for s, r in per_problem.items() if r["reward"] == 1.0]
    speedups = [r["speedup"] for r in per_problem.values() if r.get("speedup")]
    failures = [
        f"{stem}: {'; '.join(r.get('reasons', []))[:300]}"
        for stem, r in per_problem.items()
        if r["reward"] != 1.0
    ]
    failures += [
        f"corpus {name}: {r['reward']:g}, expected {r['expected']}: {'; '.join(r['reasons'])[:300]}"
        for name, r in replayed["entries"].items()
        if r["reward"] is not None and not r["as_expected"]
    ]
    if device == "cuda":
        failures += [
            f"{s}: passed but no speedup was timed" for s in passed if not results[s].get("speedup")
        ]
    return verdict(
        failures,
        problems=len(per_problem),
        passed=len(passed),
        not_run=sum(r["reward"] is None for r in per_problem.values()),
        workers=workers,
        speedup_geomean=(
            round(math.exp(sum(math.log(s) for s in speedups) / len(speedups)), 3)
            if speedups
            else None
        ),
        faster_than_reference=sum(s > 1 for s in speedups),
        per_problem=per_problem,
        corpus=replayed,
    )


def replay_corpus(
    names: list[str] | None,
    device: str,
    trials: int,
    timeout_s: float,
    workers: int,
    deadline: float,
    log: Log,
) -> dict[str, Any]:
    """The corpus entries ``names`` (None: all) scored on ``device``, each against what the
    corpus expects of it (1, or its listed refusal); entries not started before ``deadline`` are
    reported as not run. Without the corpus (an installed package has no tests/) nothing runs."""
    from ..kernels import evaluate

    root = Path(__file__).resolve().parents[2]
    if not (root / "tests" / "kernels" / "corpus" / "__init__.py").is_file():
        return {"entries": {}, "skipped": f"no tests/kernels/corpus under {root}"}
    sys.path.insert(0, str(root))  # this check's own process: the checkout's tests package
    from tests.kernels import corpus

    chosen = [corpus.BY_NAME[n] for n in names] if names is not None else corpus.ENTRIES
    entries: dict[str, dict] = {}

    def one(entry) -> None:
        left = deadline - time.monotonic()
        expected = corpus.expected_reason(entry.name)
        row = {"expected": "1" if expected is None else f"0: {expected}"}
        if left < 5:
            entries[entry.name] = {**row, "reward": None, "reasons": ["not run: time was up"]}
            return
        options = {**corpus.options(entry.name), "trials": trials}
        r = evaluate(
            corpus.problem_source(entry.problem),
            entry.candidate,
            device=device,
            timeout_s=min(timeout_s, left / 2),
            **options,
        )
        met = r.reward == 1 if expected is None else any(expected in x for x in r.reasons)
        entries[entry.name] = {
            **row,
            "reward": r.reward,
            "status": r.status,
            "as_expected": met,
            "speedup": round(r.speedup, 3) if r.speedup is not None else None,
            "reasons": [] if r.reward == 1 else r.reasons,
        }
        log(f"corpus {entry.name}: reward {r.reward:g}{'' if met else ' (NOT as expected)'}")

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, chosen))
    ran = [r for r in entries.values() if r["reward"] is not None]
    return {
        "entries": {e.name: entries[e.name] for e in chosen},
        "run": len(ran),
        "as_expected": sum(r["as_expected"] for r in ran),
        "not_run": len(chosen) - len(ran),
    }
