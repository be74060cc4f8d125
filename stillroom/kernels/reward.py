"""The kernel track's reward of one answer: the validator's execution x rule reward of the
answer's ``ModelNew`` block. Grading, GRPO and the kernel tables all take it from here."""

from __future__ import annotations

from ..config import ValidatorOptions
from ..grading.formats import extract_code
from .validator import KernelResult, evaluate

NO_CODE = "no ```python block after the reasoning"


def score(
    problem_src: str, response: str, options: ValidatorOptions, *, seed: int = 0
) -> KernelResult:
    """The reward of ``response`` for the problem ``problem_src``; nothing runs without a code
    block."""
    code = extract_code(response)
    if code is None:
        return KernelResult(0.0, 0.0, 0.0, False, False, False, reasons=[NO_CODE], answered=False)
    return evaluate(problem_src, code, **options.model_dump(), seed=seed)


def timed_out(result: KernelResult) -> bool:
    return result.status == "timeout"


def harness_failed(result: KernelResult) -> bool:
    """The validator failed, not the candidate: its rewards say nothing of the answer."""
    return result.status == "harness"
