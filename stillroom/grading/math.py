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
A gold also does not parse when its braces do not balance (an unterminated ``\\boxed{``), when it
has a word of three letters or more outside ``\\text{}`` (``one half`` is not o·n·e·h·a·l·f), when
math-verify keeps it as text, or when its text has variables and its value none (a Minerva gold
``\\hbar \\omega(v+1/2)-...`` reads as 2).

Golds and answers alike are first normalised: LaTeX spacing inside digit groups removed
(``1\\,000`` is 1000), an upright e (``\\mathrm{e}``) read as Euler's number, a leading-dot decimal
given its 0 (``.35625``), and scientific notation written out as the decimal it stands for:
``4.4e7``, ``4.4E-7`` (digits, e, an integer exponent, nothing between) and ``4.4 \\times
10^{7}``, ``4.4\\cdot10^7`` are 44000000 and 0.00000044. A lone ``e`` stays Euler's number:
``2e`` is 2·e, ``e^{2}`` and ``2e^{3}`` are powers of e. Written out, the number reads the same in
a box, in ``$...$`` and in plain text (math-verify reads plain ``4.4e7`` as 4.4, ``4.4\\times10^7``
outside ``$`` as 4.4).

Numbers. A gold that is a number but not a whole one (a decimal or a fraction), against an answer
that is a number, where either is a decimal, compares with the relative tolerance ``REL_TOL``
(math-verify rounds to 6 decimal places, which makes 1.6e-19 equal 9.1e-31); decimals are read as
the decimals they write. Everything else is compared by math-verify: exact values exactly, a whole
gold so that 1000000 never equals 1000001, a decimal against an expression (``\\sqrt{2}``) and the
numbers inside tuples, sets, intervals and matrices rounded to 6 decimal places.

Bases. A number with a base subscript (``52_9``, ``1011_{2}``, ``A3_{16}``) is its digits in that
base: an answer that writes a base other than the gold's is wrong, even at the same value (the
question asked for base b; ``47`` is not ``52_9``); an answer that writes the gold's digits without
the subscript is read in the gold's base, and a number without one in base 10.

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
from decimal import Decimal
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
# Relative tolerance for a gold that is a number, not whole: half a unit in the 6th
# significant digit, so that a gold rounded to 6 digits (0.208333) is the exact value (5/24) at
# every magnitude, as math-verify's 6 decimal places are near 1 only; 5 digits (0.20833) are not.
# Qwen2.5-Math's math_equal allows 1e-4, lm-eval's Minerva and PRM800K none.
REL_TOL = sympy.Rational(5, 10**6)
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
    r"(?:\\(?:text|textbf|textit|textnormal|mbox|operatorname|begin|end)\s*\{[^{}]*\}"
    r"|\\mathrm\s*\{[^{}]{2,}\})(?:\^(?:\{\s*-?\s*\w+\s*\}|-?\w))?"
)
_JOINER = re.compile(r"(?<![A-Za-z\\])(?:and|or)(?![A-Za-z])|\\[A-Za-z]+")


# A decimal written without its 0: ".35625", "-.5" (not "3.5", "x.5" or "\\.").
_LEADING_DOT = re.compile(r"(?<![\w.}\\])\.(?=\d)")
_MANTISSA = r"(\d+(?:\.\d*)?|\.\d+)"
# "4.4e7", "4.4E-7": a number, e and an integer exponent with nothing between, in nothing longer
# (a full stop may follow).
_E_NOTATION = re.compile(rf"(?<![\w.\\]){_MANTISSA}[eE]([-+]?\d+)(?!\w|\.\d)")
# "4.4 \times 10^{7}", "4.4\cdot10^7", "4.4 × 10^{-7}": one digit of exponent unless braced.
_TIMES_TEN = re.compile(
    rf"(?<![\w.\\]){_MANTISSA}\s*(?:\\times|\\cdot|×)\s*10\s*\^\s*(?:\{{\s*([-+]?\d+)\s*\}}|(\d))"
    r"(?!\w|\^|\.\d)"
)
# Before "a \times 10^k" these bind tighter than the product: 1/2\times10^3 is 500, not 1/2000.
_BINDS_LEFT = ("/", "\\div", "^", "_")
SCI_MAX_EXP = 300  # beyond this a number is not written out: 1e400000 would be 400 kB of digits


def _written_out(mantissa: str, exponent: int) -> str:
    return format(Decimal(mantissa).scaleb(exponent), "f")


def _e_notation(m: re.Match) -> str:
    exponent = int(m.group(2))
    if abs(exponent) > SCI_MAX_EXP:
        return rf"{m.group(1)}\times10^{{{exponent}}}"  # LaTeX math-verify reads as the number
    return _written_out(m.group(1), exponent)


def _times_ten(m: re.Match) -> str:
    exponent = int(m.group(2) or m.group(3))
    before = m.string[max(0, m.start() - 8) : m.start()].rstrip()
    if abs(exponent) > SCI_MAX_EXP or before.endswith(_BINDS_LEFT):
        return m.group(0)
    return _written_out(m.group(1), exponent)


def normalise(text: str) -> str:
    """``text`` with digit groups joined, upright e as Euler's number, leading-dot decimals given
    their 0 and scientific notation written out (see module docstring)."""
    text = _LEADING_DOT.sub("0.", _DIGIT_GROUP.sub("", text))
    text = _TIMES_TEN.sub(_times_ten, _E_NOTATION.sub(_e_notation, text))
    return _UPRIGHT_E.sub("{e}", text)


# A number with a base subscript: "52_9", "1011_{2}", "A3_{16}" (digits first, or capitals with a
# digit among them: "C_1" is a variable).
_BASE_NUMBER = re.compile(r"(?<![\w.\\])(?=[0-9A-Z]*\d)[0-9A-Z]+_(?:\{\s*(\d+)\s*\}|(\d))")


def _bases(text: str) -> set[int]:
    """The bases ``text`` writes numbers in with a subscript."""
    return {int(a or b) for a, b in _BASE_NUMBER.findall(text)}


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


def _plain_letters(latex: str) -> str:
    """``latex`` without what carries no value, command names, words in ``\\text{}`` and units."""
    return _JOINER.sub(" ", _WORDS.sub(" ", latex))


def _significant(latex: str) -> str:
    """The letters and digits of ``latex`` that carry its value, sorted."""
    return "".join(sorted(c for c in _plain_letters(latex) if c.isalnum()))


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


# Function names a gold may spell in plain letters; any other run of 3 letters is a word.
_FUNCTIONS = frozenset(
    "sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln exp lim max min gcd lcm "
    "mod det deg sqrt frac".split()
)
_CONSTANTS = frozenset("eEi")  # letters that name a constant, not a variable
_SUBSCRIPT = re.compile(r"_\s*(?:\{[^{}]*\}|\w)")


def _balanced(text: str) -> bool:
    depth = 0
    for c in re.sub(r"\\[{}]", "", text):
        depth += {"{": 1, "}": -1}.get(c, 0)
        if depth < 0:
            return False
    return depth == 0


def _whole(gold: str, parsed: list) -> str | None:
    """Why ``parsed`` is not the value of all of ``gold``, or None when it is."""
    value, extracted = parsed[0], str(parsed[-1])
    if isinstance(value, str):
        return f"math-verify keeps {value!r} as text, not as a value"
    if isinstance(value, sympy.Basic) and value.has(sympy.zoo, sympy.nan):
        return f"parses to {value}, an undefined value"
    if _significant(extracted) != _significant(_value_text(gold)):
        return f"parses to {value} (read from {extracted!r}), not to its whole text"
    # A subscript is part of its symbol's name (S_{MBCN} is one symbol), not letters of its own.
    letters = _SUBSCRIPT.sub(" ", _plain_letters(_value_text(gold)))
    words = sorted({w for w in re.findall(r"[A-Za-z]{3,}", letters) if w not in _FUNCTIONS})
    if words:
        return f"parses {', '.join(map(repr, words))} as products of letters, not as words"
    variables = set(re.findall(r"[A-Za-z]", letters)) - _CONSTANTS
    if variables and not value.atoms(sympy.Symbol, sympy.core.function.AppliedUndef):
        return f"parses to {value}, without its variables {', '.join(sorted(variables))}"
    return None


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str, timeout: int | None) -> tuple[tuple, str | None]:
    """The gold parsed, or () and what is wrong with it."""
    gold = normalise(gold)
    if not _balanced(gold):
        return (), "its braces do not balance"
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
    written = _bases(extracted)
    if written and not written <= (_bases(normalise(gold)) or {10}):
        return Grade(False, extracted, "ok")  # digits in another base, whatever their value
    # Pair by pair, as verify() does itself, so that a timeout is seen rather than read as "wrong".
    timed_out = False
    for g in gold_parsed:
        for p in pred:
            try:
                close = _close(g, p)
                if close is None:
                    close = verify(
                        g,
                        p,
                        float_rounding=FLOAT_ROUNDING,
                        strict=STRICT,
                        timeout_seconds=timeout,
                        raise_on_error=True,
                    )
                if close:
                    return Grade(True, extracted, "ok")
            except TimeoutException:
                timed_out = True
            except Exception:
                pass
    return Grade(False, extracted, "timeout" if timed_out else "ok")


def _exact(x: sympy.Number) -> sympy.Rational:
    """``x`` as the number it writes: a decimal as its decimal (0.333333 is 333333/10^6, not the
    nearest binary fraction)."""
    return sympy.Rational(str(x)) if isinstance(x, sympy.Float) else x


def _close(gold: Any, pred: Any) -> bool | None:
    """Whether a gold that is a number, not whole, is within ``REL_TOL`` of an answer that is a
    number, where either is a decimal; None where math-verify decides (see module docstring).
    Numbers only: exact arithmetic on them is cheap, where an expression (9^{9^{9^{9}}}) could
    take forever outside math-verify's time limit."""
    numbers = (gold, pred)
    if not all(isinstance(x, sympy.Number) and x.is_finite for x in numbers):
        return None
    if not any(isinstance(x, sympy.Float) for x in numbers):
        return None
    gold, pred = _exact(gold), _exact(pred)
    if gold.is_integer:
        return None
    return bool(abs(gold - pred) <= REL_TOL * max(abs(gold), abs(pred)))


def grade(response: str, gold: str, options: Options) -> Grade:
    return grade_math(response, gold, options.boxed)


def info(options: Options) -> dict[str, Any]:
    return {
        "name": "math-verify",
        "version": importlib.metadata.version("math-verify"),
        "options": {
            "float_rounding": FLOAT_ROUNDING,
            "rel_tol": float(REL_TOL),
            "numbers": "a gold that is a number, not whole, against an answer that is a number, "
            "either a decimal: within rel_tol of each other; all else as math-verify compares "
            "(float_rounding), whole golds and numbers inside tuples, sets and intervals too",
            "bases": "an answer in a base the gold does not write (52_8 for 52_9, 47 for 52_9) "
            "is wrong; the gold's digits without the subscript are read in its base",
            "strict": STRICT,
            "pred_extraction": PRED_EXTRACTION,
            "boxed": options.boxed,
            "gold": "must parse as its whole text, braces balanced, no words outside \\text{}, "
            "a value (not text) that keeps its text's variables",
            "normalise": "LaTeX spacing in digit groups removed, upright e is Euler's number, "
            ".5 is 0.5, scientific notation (4.4e7, 4.4\\times10^{7}) written out as its "
            f"decimal up to 10^±{SCI_MAX_EXP}; 2e and e^{{2}} are Euler's e",
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
