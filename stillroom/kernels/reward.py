"""The kernel track's reward of one answer's code: the validator's execution x rule reward of its
``ModelNew`` module. Reading the module out of an answer is the grader's
(grading.kernel.score_answer, which grading, GRPO and the GPU check call): the kernel track reads
no answer format."""

from __future__ import annotations

from ..config import ValidatorOptions
from .validator import KernelResult, evaluate

NO_CODE = "no ```python block after the reasoning"


def score(
    problem_src: str, code: str | None, options: ValidatorOptions, *, seed: int = 0
) -> KernelResult:
    """The reward of the module ``code`` for the problem ``problem_src``; nothing runs without one
    (None: the answer had no code block)."""
    if code is None:
        return KernelResult(0.0, 0.0, 0.0, False, False, False, reasons=[NO_CODE], answered=False)
    return evaluate(problem_src, code, **options.model_dump(), seed=seed)


def timed_out(result: KernelResult) -> bool:
    return result.status == "timeout"


def harness_failed(result: KernelResult) -> bool:
    """The validator failed, not the candidate: its rewards say nothing of the answer."""
    return result.status == "harness"
