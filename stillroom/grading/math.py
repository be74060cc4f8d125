"""Math answers: the last extracted expression against the gold, through math-verify.

Time limits. math-verify bounds its own work with ``signal.alarm``, which works only in a main
thread and only between Python bytecodes, and a pathological answer (``9^{9^{9^{9}}}``) still costs
its full timeout per parse/verify call. Grading workers (workers.py) therefore switch math-verify's
alarms off and enforce one hard wall-clock limit per item by killing the worker.
"""

from __future__ import annotations

import functools
import importlib.metadata
import threading
from typing import Any

import math_verify.grader
import math_verify.parser
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from .formats import answer_text
from .result import GOLD_UNPARSEABLE, NO_ANSWER, TIMEOUT_S, Grade, Options

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


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str, timeout: int | None) -> tuple:
    # '$...$' first: bare "3\sqrt{3}" parses as 3 and "2, 3" as 3, wrapped they parse whole.
    for text in (gold, f"${gold}$") if "$" in gold else (f"${gold}$", gold):
        try:
            parsed = parse(text, parsing_timeout=timeout, raise_on_error=True)
        except Exception:
            parsed = []
        if parsed:
            return tuple(parsed)
    return ()


def grade_math(response: str, gold: str) -> Grade:
    timeout = _timeout()
    try:
        gold_parsed = _parse_gold(gold, timeout)
        if not gold_parsed:
            return GOLD_UNPARSEABLE
        text = answer_text(response)
        if text is None:
            return NO_ANSWER
        try:
            pred = parse(
                text,
                extraction_config=list(_PRED_CONFIG),
                parsing_timeout=timeout,
                raise_on_error=True,
            )
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
    return grade_math(response, gold)


def info(options: Options) -> dict[str, Any]:
    return {
        "name": "math-verify",
        "version": importlib.metadata.version("math-verify"),
        "options": {
            "float_rounding": FLOAT_ROUNDING,
            "strict": STRICT,
            "pred_extraction": PRED_EXTRACTION,
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
