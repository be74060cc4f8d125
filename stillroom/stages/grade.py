"""Rules grade_generation and grade_eval: a ``grade`` and a ``grader`` for every sample record,
teacher samples and evaluation samples alike, graded in killable worker processes
(stillroom.grading)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

from pydantic import Field

from ..config import Effort, Experiment
from ..grading.choice import item_letters
from ..grading.dispatch import GRADER_INFO, check_kinds, grader_info, item_limit
from ..grading.result import Options
from ..io import DataError, read_jsonl, write_jsonl
from .contract import stage


class Params(Options):
    effort: Effort | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="grade only the records of this effort (of a generation file that holds an "
        "effort group's)",
    )


def job_params(exp: Experiment, effort: str | None = None) -> Params:
    """The params of a grade_generation or grade_eval job: eval's letters and boxed, the kernel
    validator's options, and ``effort`` where its samples file holds an effort group's."""
    kernel = {"kernel": exp.kernels.validator} if exp.kernels else {}
    one = {"effort": effort} if effort else {}
    return Params(seed=exp.seed, letters=exp.eval.letters, boxed=exp.eval.boxed, **kernel, **one)


@stage(
    "grade",
    params=Params,
    inputs=("samples",),
    outputs=("graded",),
    help="grade samples: math, multiple choice, instructions, code and kernels, each by its grader",
)
def run(
    *,
    samples: str,
    out_graded: str,
    params: Mapping[str, Any] | Params,
    threads: int = 1,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """``threads`` worker processes grade (at least one)."""
    # loads sympy (math_verify): imported here, not when the CLI imports this module for --help
    from ..grading.workers import grade_many

    options = Params.parse(params, where="grade")
    rows = read_jsonl(samples, required=("key", "response", "answer", "kind"))
    if options.effort:
        rows = [r for r in rows if r.get("effort") == options.effort]
        if not rows:
            raise DataError(f"{samples}: no records of effort {options.effort} to grade")
    kinds = {r["kind"] for r in rows}
    check_kinds(kinds)
    timeout_s = item_limit(kinds, options)
    # A budget-forced answer continued past the budget is also graded as a hard cutoff leaves it:
    # its first segment, the answer cut at the budget (the budget table compares the two on the
    # same samples); an answer that ended within the budget is the same answer either way.
    cut = [i for i, r in enumerate(rows) if r.get("budget") and len(r.get("segments") or ()) > 1]
    # A sample whose request failed for good has no response: it is graded as no answer.
    grades = grade_many(
        [item(r) for r in rows]
        + [item({**rows[i], "response": rows[i]["segments"][0]}) for i in cut],
        workers=max(1, threads),
        letters=options.letters,
        timeout_s=timeout_s,
        kernel=options.kernel.dump(),
        seed=options.seed,
        boxed=options.boxed,
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
    # Per benchmark (evaluation samples) or source (teacher samples), each gold once.
    bad_golds: dict[str, dict[str, str]] = {}
    for r, g in zip(rows, grades, strict=True):
        if g.status == "gold_unparseable":
            reason = (g.details or {}).get("gold_problem", "does not parse")
            bad_golds.setdefault(_origin(r), {})[str(r.get("prompt_id", r["key"]))] = reason
    for origin, golds in sorted(bad_golds.items()):
        example = next(iter(golds.items()))
        log(
            f"warning: {origin}: {len(golds)} problems have a gold that cannot be graded against "
            f"(their samples are counted apart, not as wrong), e.g. {example[0]}: {example[1]}"
        )
    return {
        "samples": len(rows),
        **counts,
        "gold_problems": {o: len(golds) for o, golds in sorted(bad_golds.items())},
        "status": dict(status),
        "accuracy": accuracy,
        "grader": GRADER_INFO,
        "graders": graders,
    }


def item(row: Mapping[str, Any]) -> tuple[str, ...]:
    """A sample row as a grading item; a choice item with the letters its prompt lists."""
    base = (row.get("response") or "", row["answer"], row["kind"])
    own = item_letters(row.get("prompt") or "") if row["kind"] == "choice" else None
    return (*base, own) if own else base


def _origin(row: Mapping[str, Any]) -> str:
    return str(row.get("benchmark") or row.get("source") or "unknown")
