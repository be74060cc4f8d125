"""One grader per kind of problem, each a module of this package with the same signature:
``grade(response, gold, options) -> Grade`` and ``info(options) -> dict`` (what graded it: name,
version, options), and optionally ``item_limit(options)``, the least hard time limit per item its
own limits need."""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from ..config.base import DEFAULT_LETTERS
from ..sandbox import backstop_s
from .result import Grade, Options

KINDS = ("math", "choice", "instructions", "code", "kernel")

# A summary of the rules for the provenance of a grading job; each record names its own grader.
GRADER_INFO: dict[str, Any] = {
    "grader": "stillroom.grading",
    "math_verify": importlib.metadata.version("math-verify"),
    "math": {
        "gold_parse": "math_verify.parse default config on '$gold$', then on the bare gold; "
        "a gold that does not parse as its whole text is gold_unparseable, with the reason",
        "pred_extraction": "the answer's last \\boxed{} (grade.boxed: last) or all of it, then "
        "the last boxed or plain expression (LatexExtractionConfig, ExprExtractionConfig)",
        "normalise": "LaTeX spacing in digit groups removed (1\\,000), \\mathrm{e} is e, .5 is "
        "0.5, scientific notation (4.4e7, 4.4\\times10^{7}) written out as its decimal",
        "verify": "math_verify.verify(gold, pred), float_rounding 6, strict; a gold that is a "
        "real number, not whole, within relative 5e-6 of a decimal answer; an answer in a base "
        "the gold does not write (52_8 for 52_9) is wrong",
        "timeout": "CPU seconds per item in a killable worker process (RLIMIT_CPU); wall time "
        "only a far backstop, an item past it retried, then graded harness",
    },
    "choice": "last '\\boxed{X}', 'answer: X' or 'answer is X' "
    "('answer' any case, X case-sensitive, in $, **, (), \\textbf{} or the like); "
    "X among the item's own letters",
    "instructions": "IFEval's 25 checks as lm-eval implements them; correct is prompt-level "
    "strict, each instruction's strict and loose verdicts in the details",
    "think": "only text after the last </think> is graded; an unclosed <think> is no_answer",
}


@functools.cache
def grader(kind: str) -> ModuleType:
    """The module grading ``kind`` (imported on first use: the kernel grader pulls in the kernel
    track)."""
    if kind not in KINDS:
        raise ValueError(f"unknown grading kind {kind!r}; expected one of {', '.join(KINDS)}")
    return importlib.import_module(f"{__package__}.{kind}")


def check_kinds(kinds: set[str]) -> None:
    bad = sorted(kinds - set(KINDS))
    if bad:
        raise ValueError(f"unknown grading kind {bad[0]!r}; expected one of {', '.join(KINDS)}")


def grade(
    response: str,
    gold: str,
    kind: str,
    letters: str = DEFAULT_LETTERS,
    kernel: Mapping[str, Any] | None = None,
    boxed: str = "last",
) -> Grade:
    """One answer graded in this process; ``kernel``: the validator's options for kernel answers."""
    options = Options.parse({"letters": letters, "kernel": dict(kernel or {}), "boxed": boxed})
    return grader(kind).grade(response, gold, options)


def item_limit(kinds: set[str], options: Options) -> float:
    """The hard time limit per item for a mix of kinds: each kind's own limit must fire first."""
    limits = [grader(k).item_limit(options) for k in kinds if hasattr(grader(k), "item_limit")]
    return max([options.timeout_s, *limits])


def grader_info(kind: str, options: Options, timeout_s: float | None) -> dict[str, Any]:
    """What graded a record of ``kind``: name, version and options, recorded with every graded
    record. ``timeout_s`` None means graded in this process under math-verify's own alarms."""
    if timeout_s is None:
        limit = {"timeout_s": options.timeout_s, "timeout": "signal, per math-verify call"}
    else:
        limit = {
            "timeout_s": timeout_s,
            "timeout": "CPU seconds, per item",
            "backstop_s": backstop_s(timeout_s),
        }
    info = grader(kind).info(options)
    return {**info, "options": {**limit, **info["options"]}}
