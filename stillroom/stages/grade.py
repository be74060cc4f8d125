"""Rules grade_generation and grade_eval: a ``grade`` and a ``grader`` for every sample record,
teacher samples and evaluation samples alike, graded in killable worker processes
(stillroom.grading)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

from ..grading.dispatch import GRADER_INFO, check_kinds, grader_info, item_limit
from ..grading.result import Options
from ..grading.workers import grade_many
from ..io import read_jsonl, write_jsonl

Params = Options


def run(
    *,
    samples: str,
    out_graded: str,
    params: Mapping[str, Any] | Options,
    threads: int = 1,
    log: Callable[[str], None] = print,
    **_: Any,
) -> dict[str, Any]:
    """``threads`` worker processes grade (at least one)."""
    options = Options.parse(params, where="grade")
    rows = read_jsonl(samples, required=("key", "response", "answer", "kind"))
    kinds = {r["kind"] for r in rows}
    check_kinds(kinds)
    timeout_s = item_limit(kinds, options)
    # A budget-forced answer continued past the budget is also graded as a hard cutoff leaves it:
    # its first segment, the answer cut at the budget (the budget table compares the two on the
    # same samples); an answer that ended within the budget is the same answer either way.
    cut = [i for i, r in enumerate(rows) if r.get("budget") and len(r.get("segments") or ()) > 1]
    # A sample whose request failed for good has no response: it is graded as no answer.
    grades = grade_many(
        [(r["response"] or "", r["answer"], r["kind"]) for r in rows]
        + [(rows[i]["segments"][0], rows[i]["answer"], rows[i]["kind"]) for i in cut],
        workers=max(1, threads),
        letters=options.letters,
        timeout_s=timeout_s,
        kernel=options.kernel.dump(),
        seed=options.seed,
    )
    grades, cut_grades = grades[: len(rows)], dict(zip(cut, grades[len(rows) :], strict=True))
    graders = {kind: grader_info(kind, options, timeout_s) for kind in kinds}
    for i, (row, g) in enumerate(zip(rows, grades, strict=True)):
        row["grade"] = asdict(g)
        row["grader"] = graders[row["kind"]]
        if row.get("budget"):
            row["cutoff_grade"] = asdict(cut_grades.get(i, g))
    write_jsonl(out_graded, rows)
    status = Counter(g.status for g in grades)
    accuracy = {
        kind: round(
            sum(g.correct for r, g in zip(rows, grades, strict=True) if r["kind"] == kind)
            / sum(r["kind"] == kind for r in rows),
            4,
        )
        for kind in sorted(kinds)
    }
    # A wrong answer is a graded one that is not right; no answer, timeouts, unparseable golds and
    # failures of the kernel validator itself are counted apart.
    counts = {
        "correct": sum(g.correct for g in grades),
        "wrong": sum(g.status == "ok" and not g.correct for g in grades),
        **{
            s: status[s] for s in ("no_answer", "timeout", "crashed", "gold_unparseable", "harness")
        },
    }
    log(f"graded {len(rows)} samples: accuracy {accuracy}, status {dict(status)}")
    if counts["gold_unparseable"]:
        log(
            f"warning: {counts['gold_unparseable']} samples have a gold answer that does not parse "
            "(graded incorrect, counted apart from wrong answers)"
        )
    return {
        "samples": len(rows),
        **counts,
        "status": dict(status),
        "accuracy": accuracy,
        "grader": GRADER_INFO,
        "graders": graders,
    }
