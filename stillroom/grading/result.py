"""What grading says of one answer, whatever its kind."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field

from ..config import Boxed, Letters, StageParams, ValidatorOptions


@dataclass(frozen=True)
class Grade:
    correct: bool
    extracted: str | None
    # "ok" (right or wrong), "no_answer", "gold_unparseable" (a benchmark problem, not a wrong
    # answer), "timeout" (the answer's check ran out of CPU time: its own cost, the same on a
    # busy machine), "crashed" (the worker died on this item, e.g. killed for memory), or
    # "harness" (the grader itself failed, or an item ran past the wall-clock backstop on every
    # try: not the answer's fault, counted apart)
    status: str
    details: dict[str, Any] | None = None  # per-kind extras: instruction scores, the run's status


NO_ANSWER = Grade(False, None, "no_answer")


def gold_problem(reason: str) -> Grade:
    """A gold that cannot be graded against, and why: counted apart, never a wrong answer."""
    return Grade(False, None, "gold_unparseable", {"gold_problem": reason})


TIMED_OUT = Grade(False, None, "timeout")
CRASHED = Grade(False, None, "crashed")

TIMEOUT_S = 5  # CPU seconds per item in a grading worker, unless a kind needs more
BACKSTOP_TRIES = 3  # tries of an item that keeps running past the backstop, then "harness"


def past_backstop(tries: int, limit_s: float) -> Grade:
    """An item that ran past its wall-clock backstop on every try: the machine's fault, not the
    answer's (a CPU-time limit judges answers)."""
    why = f"past the wall-clock backstop of {limit_s:g} s on {tries} tries, under its CPU limit"
    return Grade(False, None, "harness", {"fault": why})


class Options(StageParams):
    """How answers are graded: the grade stage's params."""

    letters: Letters
    boxed: Boxed
    kernel: ValidatorOptions = ValidatorOptions()
    timeout_s: float = Field(TIMEOUT_S, gt=0, description="CPU seconds per item")
    empty_unless_given = ("kernel",)

    def param_values(self) -> dict[str, Any]:
        """timeout_s only where given: no config key sets it (a hand-typed --params may)."""
        values = super().param_values()
        if "timeout_s" not in self.model_fields_set:
            del values["timeout_s"]
        return values
