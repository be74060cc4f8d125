"""Math-Verify's own test cases (tests/grading/data/math_verify_cases.json, vendored with their
source, commit and license) through the project's grader under the project's configuration.

Every case must agree (graded, and correct exactly when Math-Verify expects) unless it is listed in
DISAGREE by id with the reason; a listed case that starts to agree must be taken off the list."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stillroom.grading import grade_math

CASES = json.loads((Path(__file__).parent / "data" / "math_verify_cases.json").read_text())["cases"]

_LAST_BOXED = (
    "boxed: last (the project's default) grades the answer's last \\boxed{}; Math-Verify joins all "
    "of them into a set"
)
_GOLD_PROSE = "the gold is prose: its parse leaves out words, so it is a gold problem, not graded"
_EXPR_ONLY = (
    "Math-Verify's test extracts plain expressions only (a decimal comma); LaTeX reads a set"
)
_LATEX_ONLY = "Math-Verify's test extracts LaTeX only; the project also extracts plain expressions"
_ROUNDING = "Math-Verify's test rounds more coarsely than the project's float_rounding 6"
# id -> (what the project's grader says: "correct", "wrong", "no_answer" or "gold_unparseable",
# and why it differs from Math-Verify's expectation)
DISAGREE: dict[str, tuple[str, str]] = {
    "test_all::test_number_extraction#7": ("wrong", _EXPR_ONLY),
    "test_all::test_number_extraction#19": (
        "no_answer",
        "Math-Verify's test extracts plain expressions only, which finds a 2 inside the word "
        "'AZYUK2A'; LaTeX extraction finds no answer there",
    ),
    "test_all::test_latex_notation#6": ("correct", _LATEX_ONLY),
    "test_all::test_latex_notation#7": ("correct", _LATEX_ONLY),
    "test_all::test_latex_notation_math#3": (
        "gold_unparseable",
        _GOLD_PROSE + " (a worked solution without a box, and a note after its final answer)",
    ),
    "test_all::test_latex_notation_math#26": (
        "gold_unparseable",
        "the gold '$125$ miles' has a unit outside its math, which the parse leaves out",
    ),
    "test_all::test_relations_math#22": (
        "gold_unparseable",
        "the gold '1 = \\zzz = x = 0' (an unknown command in a chain) parses to 0, which leaves "
        "out its variable x",
    ),
    "test_all::test_symbols#1": (
        "gold_unparseable",
        "the gold has a tab where the \\t of \\text was (a Python escape in Math-Verify's "
        "test), leaving the word 'ext'",
    ),
    "test_all::test_complex_math_expressions#5": (
        "gold_unparseable",
        "the gold has a form feed where the \\f of \\frac was (a Python escape in "
        "Math-Verify's test), leaving the word 'rac'",
    ),
    "test_numina_cases::test_numina_cases#25": (
        "gold_unparseable",
        "the gold's \\boxed{ is never closed: its braces do not balance",
    ),
    "test_open_thoughts::test_open_thoughts#8": (
        "gold_unparseable",
        "math-verify keeps the gold (x = ..., x = ...\\pm...) as text, which it compares as a "
        "string; the project grades only against a value",
    ),
    "test_all::test_precision#1": ("wrong", _ROUNDING + " (4 digits)"),
    "test_all::test_complex_math_expressions#8": ("wrong", _ROUNDING + " (2 digits)"),
    "test_all::test_complex_math_expressions#14": ("wrong", _ROUNDING + " (2 digits)"),
    "test_all::test_math_extraction_additional_cases#18": (
        "wrong",
        _LAST_BOXED + ": here the last box is an intermediate result (255) and the final answer "
        "($10,455$) is stated after it unboxed",
    ),
    "test_all::test_math_extraction_additional_cases#29": ("wrong", _LAST_BOXED),
    "test_all::test_set_rel_assymetry#3": (
        "wrong",
        "Math-Verify's test allows comparing a set with a relation (allow_set_relation_comp); "
        "the project does not",
    ),
    "test_boxed::test_boxed#2": ("gold_unparseable", _GOLD_PROSE),
    "test_boxed::test_boxed#3": ("gold_unparseable", _GOLD_PROSE),
    "test_numina_cases::test_numina_cases#13": ("wrong", _LAST_BOXED),
    **{
        f"test_open_thoughts::test_open_thoughts#{n}": ("wrong", _LAST_BOXED)
        for n in (13, 14, 15, 17, 19, 20, 24, 25, 26, 27)
    },
    "test_open_thoughts::test_open_thoughts#28": (
        "gold_unparseable",
        "the gold's two boxes are apart by words ('papers', 'bins') that its parse leaves out",
    ),
    "test_open_thoughts::test_open_thoughts#29": (
        "gold_unparseable",
        "the gold's two boxes are apart by words ('no no no') that its parse leaves out; "
        "Math-Verify grades it wrong, the project does not grade it",
    ),
    "test_strict::test_strict_variable_comparison#2": (
        "wrong",
        "Math-Verify's test is not strict (f(x) may equal f(y)); the project grades strictly",
    ),
    "test_yujianll::test_string_extraction#10": (
        "wrong",
        "Math-Verify drops \\mathrm{e}, so 1-1/e and 1+1/e both parse as 1 and its test expects "
        "them equal; the project reads upright e as Euler's number",
    ),
    "test_yujianll::test_string_extraction#13": (
        "gold_unparseable",
        "the gold 12:00 parses as 12/0, an undefined value",
    ),
    "test_yujianll::test_string_extraction#14": (
        "gold_unparseable",
        "the gold 12:00 parses as 12/0, an undefined value",
    ),
}


def _verdict(case: dict) -> str:
    g = grade_math(case["pred"], case["gold"])
    if g.status == "ok":
        return "correct" if g.correct else "wrong"
    assert g.status in ("no_answer", "gold_unparseable"), (case["id"], g)
    return g.status


def test_vendored_cases_are_whole():
    assert len(CASES) == 270 and len({c["id"] for c in CASES}) == len(CASES)
    assert set(DISAGREE) <= {c["id"] for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_math_verify_case(case):
    verdict = _verdict(case)
    if case["id"] in DISAGREE:
        assert verdict == DISAGREE[case["id"]][0], case
    else:
        assert verdict == ("correct" if case["expected"] else "wrong"), case
