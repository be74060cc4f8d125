"""Graded samples as grids of [problems, samples] for paired comparisons: every model's grid must
have the same problems and sample indices."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from ..io import DataError, iter_jsonl


class Grades(NamedTuple):
    """One model's graded samples, the arrays [problems, samples]."""

    index: dict[str, int]  # problem id -> its row
    grades: np.ndarray  # each record's grade dict (object)
    tokens: np.ndarray  # completion tokens
    capped: np.ndarray  # 1 where the answer was cut off at the overall token limit
    excluded: int  # problems left out for a gold answer that does not parse


class Scores(NamedTuple):
    """As Grades, each grade scored as correct (1) or not (0)."""

    index: dict[str, int]
    score: np.ndarray
    tokens: np.ndarray
    capped: np.ndarray
    excluded: int


def grade_grid(path: str, field: str = "grade") -> Grades:
    """The grid of one model's graded samples (grades: each record's ``field``, its grade dict by
    default). Problems whose gold answer does not parse are excluded (a benchmark bug, not a wrong
    answer) and counted."""
    cells: dict[tuple[str, int], tuple[dict, int, bool]] = {}
    excluded = set()
    for rec in iter_jsonl(path, required=("prompt_id", "sample_index", field, "completion_tokens")):
        if rec[field].get("status") == "gold_unparseable":
            excluded.add(rec["prompt_id"])
            continue
        cells[(rec["prompt_id"], rec["sample_index"])] = (
            rec[field],
            rec["completion_tokens"],
            rec.get("finish_reason") == "length",
        )
    problems = sorted({p for p, _ in cells})
    samples = sorted({s for _, s in cells})
    if len(cells) != len(problems) * len(samples):
        raise DataError(
            f"{path}: not every problem has samples {samples}; paired tables need a full grid"
        )
    index = {p: i for i, p in enumerate(problems)}
    grades = np.empty((len(problems), len(samples)), dtype=object)
    tokens, capped = np.zeros(grades.shape), np.zeros(grades.shape)
    for (p, s), (g, t, cut) in cells.items():
        i, j = index[p], samples.index(s)
        grades[i, j], tokens[i, j], capped[i, j] = g, t, cut
    return Grades(index, grades, tokens, capped, len(excluded))


def scores(
    grades: np.ndarray, value: Callable[[Mapping[str, Any]], float] = lambda g: bool(g["correct"])
) -> np.ndarray:
    """``value`` of every grade of a grid (default: correct, as 0/1)."""
    return np.array([float(value(g)) for g in grades.flat]).reshape(grades.shape)


def score_matrix(path: str, field: str = "grade") -> Scores:
    """As grade_grid, with each grade scored as correct (1) or not (0)."""
    g = grade_grid(path, field)
    return Scores(g.index, scores(g.grades), g.tokens, g.capped, g.excluded)


INSTRUCTION_METRICS = ("prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose")


def instruction_metrics(path: str) -> dict[str, float] | None:
    """IFEval's four accuracies of one model's graded instruction samples, None unless every
    record is of kind ``instructions``: prompt level, the share of answers that follow all their
    instructions; instruction level, the share of all instructions followed, pooled over answers;
    each strict and loose. An answer graded without verdicts (timed out, crashed) follows none of
    its gold's instructions; golds that do not parse are excluded, as from the paired grid."""
    prompts: dict[str, list[bool]] = {"strict": [], "loose": []}
    instructions: dict[str, list[bool]] = {"strict": [], "loose": []}
    for rec in iter_jsonl(path, required=("grade",)):
        if rec.get("kind") != "instructions":
            return None
        grade = rec["grade"]
        if grade.get("status") == "gold_unparseable":
            continue
        details = grade.get("details") or {}
        for level in ("strict", "loose"):
            verdicts = details.get(level)
            if verdicts is None:
                try:
                    verdicts = [False] * len(json.loads(rec["answer"]))
                except (ValueError, TypeError) as exc:
                    raise DataError(
                        f"{path}: prompt {rec.get('prompt_id')}: no instruction verdicts and a "
                        f"gold that is not a JSON list ({exc})"
                    ) from None
            prompts[level].append(all(verdicts))
            instructions[level].extend(verdicts)
    if not prompts["strict"]:
        return None
    return {
        f"{unit}_{level}": float(np.mean(counts[level]))
        for unit, counts in (("prompt", prompts), ("instruction", instructions))
        for level in ("strict", "loose")
    }
