"""Math answers: an expression extracted from the answer (by default from its last ``\\boxed{}``)
against the gold, through math-verify.

Golds. math-verify extracts the first expression it can from a text and drops what it cannot read,
so a gold can silently become something else: ``1-\\frac{1}{\\mathrm{x}}`` parses as ``1``.
A gold must therefore parse as its whole text: every letter and digit of its value (the gold, or
the content of its one ``\\boxed{}``, or of several boxes with nothing but "and" or commas between
them) must be in what math-verify read of it, leaving out command names, ``\\text{}`` words and
units, and a joining "and"/"or". A gold that does not, or that parses to nothing or to an undefined
value (``12:00`` is 12/0), is a gold problem: status ``gold_unparseable``, the reason in
``details``, never graded. What latex2sympy drops inside the text math-verify read is not seen.
Golds and answers alike first have LaTeX spacing inside digit groups removed (``1\\,000`` is 1000)
and an upright e (``\\mathrm{e}``) read as Euler's number.

Time limits. math-verify bounds its own work with ``signal.alarm``, which works only in a main
thread and only between Python bytecodes, and a pathological answer (``9^{9^{9^{9}}}``) still costs
its full timeout per parse/verify call. Grading workers (workers.py) therefore switch math-verify's
alarms off and enforce one hard wall-clock limit per item by killing the worker.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
import threading
from typing import Any

import math_verify.grader
import math_verify.parser
import sympy
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from .formats import answer_text
from .result import NO_ANSWER, TIMEOUT_S, Grade, Options, gold_problem

FLOAT_ROUNDING = 6  # math_verify.verify's defaults, passed explicitly so that they are recorded
STRICT = True
_PRED_CONFIG = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())
PRED_EXTRACTION = ["LatexExtractionConfig(boxed_match_priority=0)", "ExprExtractionConfig()"]
_alarms = True  # off in grading workers, where the parent's kill is the time limit


def use_worker_limits() -> None:
    """In a grading worker: no math-verify alarms (the parent kills a slow item), and no warning
    that there are none."""
    global _alarms
    _alarms = False
    math_verify.parser.TIMEOUT_WARNING_SHOWN = math_verify.grader.TIMEOUT_WARNING_SHOWN = True


def _timeout() -> int | None:
    # SIGALRM can only be armed from the main thread; elsewhere math-verify raises unless disabled.
    if not _alarms or threading.current_thread() is not threading.main_thread():
        return None
    return int(TIMEOUT_S)


# LaTeX spacing or a braced comma inside a number's digit groups ("1\,000", "1\ 000", "1{,}000"):
# only before exactly three digits, so "1{,}5" stays a decimal comma and "1,2" a set.
_DIGIT_GROUP = re.compile(r"(?<=\d)(?:\\[,;:! ]|~|\{,\})(?=\d{3}(?!\d))")
# Upright e is Euler's number; math-verify reads \mathrm{e} as a symbol, or drops it.
_UPRIGHT_E = re.compile(r"\\(?:mathrm|operatorname)\s*\{\s*e\s*\}")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
# What carries no value when a gold is checked against what math-verify read of it: words and
# units (with a power: cm^2; an upright single letter is a symbol, not a unit), command names
# (math-verify rewrites 1/3 as \frac{1}{3}), joining words. What is left, its letters and digits,
# must all be read.
_WORDS = re.compile(
    r"(?:\\(?:text|textbf|textit|textnormal|mbox)\s*\{[^{}]*\}|\\mathrm\s*\{[^{}]{2,}\})"
    r"(?:\^\{?\w\}?)?"
)
_JOINER = re.compile(r"(?<![A-Za-z\\])(?:and|or)(?![A-Za-z])|\\[A-Za-z]+")


def normalise(text: str) -> str:
    """``text`` with digit groups joined and upright e as Euler's number (see module docstring)."""
    return _UPRIGHT_E.sub("{e}", _DIGIT_GROUP.sub("", text))


def _boxes(text: str) -> list[tuple[int, int]]:
    """The spans of the complete top-level ``\\boxed{...}`` (or ``\\fbox{...}``) of ``text``."""
    spans: list[tuple[int, int]] = []
    for m in _BOXED.finditer(text):
        if spans and m.start() < spans[-1][1]:
            continue  # inside the previous box
        depth = 0
        for i in range(m.end() - 1, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                spans.append((m.start(), i + 1))
                break
    return spans


def last_boxed(text: str) -> str:
    """The last complete ``\\boxed{...}`` of ``text``, else ``text``."""
    spans = _boxes(text)
    return text[slice(*spans[-1])] if spans else text


def _significant(latex: str) -> str:
    """The letters and digits of ``latex`` that carry its value, sorted."""
    return "".join(sorted(c for c in _JOINER.sub(" ", _WORDS.sub(" ", latex)) if c.isalnum()))


def _value_text(gold: str) -> str:
    """The part of ``gold`` that is its value: the content of its one ``\\boxed{}`` (prose around
    a single box is a worked solution), of several boxes joined by nothing but joiners (math-verify
    reads them as a set), else all of it."""
    spans = _boxes(gold)
    inner = [gold[a : b - 1].split("{", 1)[1] for a, b in spans]
    if len(spans) == 1:
        return inner[0]
    edges = [0, *(i for span in spans for i in span), len(gold)]
    outside = "".join(gold[a:b] for a, b in zip(edges[::2], edges[1::2], strict=True))
    return ",".join(inner) if spans and not _significant(outside) else gold


def _whole(gold: str, parsed: list) -> str | None:
    """Why ``parsed`` is not the value of all of ``gold``, or None when it is."""
    value, extracted = parsed[0], str(parsed[-1])
    if isinstance(value, sympy.Basic) and value.has(sympy.zoo, sympy.nan):
        return f"parses to {value}, an undefined value"
    if _significant(extracted) != _significant(_value_text(gold)):
        return f"parses to {value} (read from {extracted!r}), not to its whole text"
    return None


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str, timeout: int | None) -> tuple[tuple, str | None]:
    """The gold parsed, or () and what is wrong with it."""
    gold = normalise(gold)
    problem = "does not parse"
    # '$...$' first: bare "3\sqrt{3}" parses as 3 and "2, 3" as 3, wrapped they parse whole.
    for text in (gold, f"${gold}$") if "$" in gold else (f"${gold}$", gold):
        try:
            parsed = parse(text, parsing_timeout=timeout, raise_on_error=True)
        except TimeoutException:
            raise
        except Exception:
            parsed = []
        if parsed:
            why = _whole(gold, parsed)
            if why is None:
                return tuple(parsed), None
            if problem == "does not parse":  # the first parse's problem is the one reported
                problem = why
    return (), problem


def grade_math(response: str, gold: str, boxed: str = "last") -> Grade:
    """``boxed``: "last" grades only the answer's last ``\\boxed{}`` (when it has one), "all"
    lets math-verify read them all."""
    timeout = _timeout()
    try:
        gold_parsed, problem = _parse_gold(gold, timeout)
        if problem is not None:
            return gold_problem(problem)
        text = answer_text(response)
        if text is None:
            return NO_ANSWER
        text = normalise(last_boxed(text) if boxed == "last" else text)
        try:
            pred = parse(
                text,
                extraction_config=list(_PRED_CONFIG),
                parsing_timeout=timeout,
                raise_on_error=True,
            )
        except TimeoutException:
            raise
        except Exception:
            pred = []
    except TimeoutException:
        return Grade(False, None, "timeout")
    if not pred:
        return NO_ANSWER
    extracted = next((p for p in pred if isinstance(p, str)), str(pred[0]))
    # Pair by pair, as verify() does itself, so that a timeout is seen rather than read as "wrong".
    timed_out = False
    for g in gold_parsed:
        for p in pred:
            try:
                if verify(
                    g,
                    p,
                    float_rounding=FLOAT_ROUNDING,
                    strict=STRICT,
                    timeout_seconds=timeout,
                    raise_on_error=True,
                ):
                    return Grade(True, extracted, "ok")
            except TimeoutException:
                timed_out = True
            except Exception:
                pass
    return Grade(False, extracted, "timeout" if timed_out else "ok")


def grade(response: str, gold: str, options: Options) -> Grade:
    return grade_math(response, gold, options.boxed)


def info(options: Options) -> dict[str, Any]:
    return {
        "name": "math-verify",
        "version": importlib.metadata.version("math-verify"),
        "options": {
            "float_rounding": FLOAT_ROUNDING,
            "strict": STRICT,
            "pred_extraction": PRED_EXTRACTION,
            "boxed": options.boxed,
            "gold": "must parse as its whole text",
            "normalise": "LaTeX spacing in digit groups removed, upright e is Euler's number",
            "sympy": importlib.metadata.version("sympy"),
        },
    }


WARM_UP = (
    (r"\boxed{\frac{1}{2}}", "0.5"),
    (r"\boxed{(1, 3]}", "(1, 3]"),
    ("The answer is 42.", "42"),
)


def warm_up() -> None:
    """The first calls build math-verify's parsers (~0.3 s): not an item's time."""
    for response, gold in WARM_UP:
        grade_math(response, gold)
