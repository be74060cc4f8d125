"""Kernel answers: the kernel track's reward (kernels/reward.py); correct means reward 1, and the
grade's details keep every flag and reason of the validator. A failure of the validator itself
grades "harness", never a wrong answer (the kernel tables leave it out)."""

from __future__ import annotations

import importlib.metadata
from dataclasses import asdict
from typing import Any

from ..config import ValidatorOptions
from ..kernels.reward import harness_failed, score, timed_out
from ..kernels.validator import KernelResult, key_digest
from .formats import extract_code
from .result import Grade, Options

MARGIN_S = 60.0  # over the candidate's limit: process start, the reference's run, the comparison


def score_answer(
    problem_src: str, response: str, options: ValidatorOptions, *, seed: int = 0
) -> KernelResult:
    """The kernel reward of an answer: its ``ModelNew`` block (extract_code) scored for the problem
    ``problem_src``; nothing runs without a code block."""
    return score(problem_src, extract_code(response), options, seed=seed)


def grade(response: str, gold: str, options: Options) -> Grade:
    """``gold`` is the problem's source: the validator runs it as the reference."""
    result = score_answer(gold, response, options.kernel, seed=options.seed)
    status = (
        "no_answer"
        if not result.answered
        else "timeout"
        if timed_out(result)
        else "harness"
        if harness_failed(result)
        else "ok"
    )
    return Grade(result.reward == 1.0, None, status, details=asdict(result))


def item_limit(options: Options) -> float:
    """The grading worker waits this long: the validator reports its own timeouts first (its
    extraction and its replay each have ``timeout_s``)."""
    return 2 * options.kernel.timeout_s + MARGIN_S


def info(options: Options) -> dict[str, Any]:
    return {
        "name": "kernel-validator",
        "version": importlib.metadata.version("stillroom"),
        "options": {
            "validator": {**options.kernel.dump(), "seed": options.seed},
            # the key of the secret seeds, by its digest only (None: random seeds per evaluation)
            "replay_key_sha256": key_digest(),
            "reward": "exec x rule",
            "triton": importlib.metadata.version("triton"),
        },
    }
