"""Check ``kernels``: every reference solution compiled by Triton on the GPU through the
kernel reward, with its speedup over the PyTorch reference."""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
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
    log: Log = print,
) -> dict[str, Any]:
    """Every reference solution answered as the procedural teacher answers (reasoning, then the
    code block) and scored by the kernel reward: compiled by Triton on a GPU (its interpreter on
    CPU), checked against the reference and, on a GPU, timed against it. Problems not started
    within ``budget_s`` are reported as not run."""
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
    per_problem = {stem: results[stem] for stem in files}
    passed = [s for s, r in per_problem.items() if r["reward"] == 1.0]
    speedups = [r["speedup"] for r in per_problem.values() if r.get("speedup")]
    failures = [
        f"{stem}: {'; '.join(r.get('reasons', []))[:300]}"
        for stem, r in per_problem.items()
        if r["reward"] != 1.0
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
    )
