"""Every gold of AIME24, AMC23, MATH-500, Minerva and OlympiadBench as a public evaluation suite
ships them (tests/grading/data/benchmark_golds.json, with its source and commit) through the
project's grader at its defaults.

Each gold either grades as correct against itself, in a box and in the plain forms a model writes,
and, when it is written as a number, parses to that number; or it is a gold problem, named in
GOLD_PROBLEMS by benchmark and row with its reason, so that a gold that changes category fails.
Then the numbers a model writes another way: each Minerva gold in scientific notation as
``m \\times 10^{k}`` and as a decimal is right, 2x or 10x off is wrong; each decimal gold 2x off is
wrong and within 1e-7 of itself right, at whatever magnitude; each base-b gold is right without its
subscript and wrong in base b+1 or as its decimal value; a leading-dot decimal is right with its 0.

The whole sweep takes about half a minute: it is marked slow but for a few golds of each class."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest
import sympy

from stillroom.grading import grade_math
from stillroom.grading.math import _parse_gold

DATA = json.loads((Path(__file__).parent / "data" / "benchmark_golds.json").read_text())
GOLDS = {f"{g['bench']}:{g['row']}": g["gold"] for g in DATA["golds"]}

_AS_TEXT = "keeps {!r} as text, not as a value"
# benchmark:row -> a part of the reason the grader gives for not grading against that gold
GOLD_PROBLEMS = {
    "minerva_math:5": _AS_TEXT.format("np.arcsin(10/13)"),  # Python code, not LaTeX
    "minerva_math:27": "keeps '\\\\frac{dM}{dt}=",  # \odot is not read
    "minerva_math:72": "parses to (dot{x}_0*sin(omega*t))/omega",  # a stray "$ $" in the middle
    "minerva_math:86": "does not parse",
    "minerva_math:104": "parses to 37/4 (read from '\\\\frac{37}{4}')",  # "m" (metres) dropped
    "minerva_math:116": "parses to 1/m (read from '\\\\frac{1}{m}')",  # the factor t dropped
    "minerva_math:137": "parses to 1/sqrt(2) (read from",  # the factor c dropped
    "minerva_math:138": "an undefined value",  # \gamma read as the gamma function
    "minerva_math:245": "parses 'SRMC' as products of letters",  # economics acronyms
    "minerva_math:250": "parses 'LRAC', 'SRAC' as products of letters",
    "minerva_math:251": "parses 'LRMC', 'SRMC' as products of letters",
    "minerva_math:261": "parses to 2, without its variables m, v",  # \hbar\omega(v+1/2)-...
    "minerva_math:268": _AS_TEXT.format("\\frac{1}{3} E_{1}+\\frac{2}{3} E_{2}"),
    "minerva_math:269": _AS_TEXT.format("E_{1},E_{2}"),
    "olympiadbench:34": _AS_TEXT.format("m_{\\max }=n^{2}-n-1"),
    "olympiadbench:73": "parses to 0 (read from '0')",  # prose: "f(x)=ax+b, where b is..."
    "olympiadbench:96": _AS_TEXT.format("t(0,4]"),
    "olympiadbench:117": "parses to 6 (read from '6')",  # "6m": the unit dropped
    "olympiadbench:194": "parses to 221 (read from '221')",  # "221,$8": the 8 dropped
}
# Golds a model can write in a box or in $...$ but not in plain text: key -> why.
PLAIN_UNREAD = {
    "minerva_math:148": "'+2': math-verify's plain-text extraction reads no number with a + sign",
}
# A few golds of each class, not marked slow: integers with a leading 0 or a ".0", a tuple, bases,
# leading-dot decimals, scientific notation, named gold problems, several answers joined by "$,$".
FAST = {
    "aime24:0",
    "aime24:7",
    "amc23:0",
    "math500:0",
    "math500:30",
    "math500:127",
    "math500:176",
    "math500:433",
    "minerva_math:1",
    "minerva_math:44",
    "minerva_math:60",
    "minerva_math:149",
    "minerva_math:5",
    "minerva_math:245",
    "minerva_math:261",
    "olympiadbench:13",
    "olympiadbench:194",
}

NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
SCIENTIFIC = re.compile(r"(\d+(?:\.\d+)?)e(-?\d+)")
BASE = re.compile(r"(\d+)_\{?(\d+)\}?")


def _params(keys):
    return [pytest.param(k, marks=() if k in FAST else pytest.mark.slow, id=k) for k in keys]


def _graded(response: str, gold: str) -> str:
    g = grade_math(response, gold)
    assert g.status in ("ok", "no_answer"), (response, gold, g)
    return "correct" if g.correct else "wrong"


def test_golds_are_whole():
    assert len(GOLDS) == 30 + 40 + 500 + 272 + 675
    assert set(GOLD_PROBLEMS) | set(PLAIN_UNREAD) | FAST <= set(GOLDS)


@pytest.mark.parametrize("key", _params(GOLDS))
def test_benchmark_gold(key):
    gold = GOLDS[key]
    g = grade_math(rf"\boxed{{{gold}}}", gold)
    if key in GOLD_PROBLEMS:
        assert g.status == "gold_unparseable", g
        assert GOLD_PROBLEMS[key] in g.details["gold_problem"], g.details
        return
    # OlympiadBench joins several answers with "$,$"; a model writes them in one box.
    text = re.sub(r"(?<!\\)\$", "", gold).rstrip(".")
    forms = [rf"\boxed{{{text}}}", f"So the final answer is ${text}$."]
    if NUMBER.fullmatch(gold):
        if key not in PLAIN_UNREAD:
            forms.append(f"The answer is {gold}.")
        (value, _), _ = _parse_gold(gold, None)
        assert sympy.Rational(str(value)) == sympy.Rational(str(Decimal(gold))), (gold, value)
    for answer in forms:
        assert _graded(answer, gold) == "correct", (answer, gold)


def _keys(pattern: re.Pattern) -> list[str]:
    return [k for k, gold in GOLDS.items() if k not in GOLD_PROBLEMS and pattern.fullmatch(gold)]


@pytest.mark.parametrize("key", _params(_keys(SCIENTIFIC)))
def test_scientific_gold_written_other_ways(key):
    gold = GOLDS[key]
    mantissa, exponent = SCIENTIFIC.fullmatch(gold).groups()
    written_out = format(Decimal(gold), "f")
    for answer in (
        rf"\boxed{{{mantissa} \times 10^{{{exponent}}}}}",
        rf"The answer is ${mantissa}\cdot10^{{{exponent}}}$.",
        rf"\boxed{{{written_out}}}",
        f"The answer is {written_out}.",
        f"The answer is {mantissa}E{exponent}.",
    ):
        assert _graded(answer, gold) == "correct", (answer, gold)
    double = Decimal(mantissa) * 2
    for wrong in (f"{double}e{exponent}", f"{mantissa}e{int(exponent) + 1}"):
        assert _graded(rf"\boxed{{{wrong}}}", gold) == "wrong", (wrong, gold)


def _decimal_keys() -> list[str]:
    return [k for k in _keys(NUMBER) if Decimal(GOLDS[k]) != Decimal(GOLDS[k]).to_integral_value()]


@pytest.mark.parametrize("key", _params(_decimal_keys()))
def test_decimal_gold_is_compared_relatively(key):
    gold = Decimal(GOLDS[key])
    near = gold * (1 + Decimal("1e-7"))
    assert _graded(rf"\boxed{{{near:f}}}", GOLDS[key]) == "correct", near
    assert _graded(rf"\boxed{{{gold * 2:f}}}", GOLDS[key]) == "wrong"


@pytest.mark.parametrize("key", _params(_keys(BASE)))
def test_base_gold_in_another_base_is_wrong(key):
    gold = GOLDS[key]
    digits, base = BASE.fullmatch(gold).groups()
    assert _graded(rf"\boxed{{{digits}_{{{base}}}}}", gold) == "correct"
    assert _graded(rf"\boxed{{{digits}}}", gold) == "correct"  # read in the gold's base
    assert _graded(rf"\boxed{{{digits}_{{{int(base) + 1}}}}}", gold) == "wrong"
    assert _graded(rf"\boxed{{{int(digits, int(base))}}}", gold) == "wrong"  # its decimal value


@pytest.mark.parametrize("key", _params(_keys(re.compile(r"\.\d+"))))
def test_leading_dot_gold_reads_as_its_decimal(key):
    gold = GOLDS[key]
    assert _graded(rf"\boxed{{0{gold}}}", gold) == "correct"
    assert _graded(rf"\boxed{{{Decimal(gold) * 10:f}}}", gold) == "wrong"
