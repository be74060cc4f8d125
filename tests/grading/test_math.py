"""Math answers graded by the real math-verify: extraction, equivalence, think handling,
timeouts."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from stillroom.grading import Grade, grade_math
from stillroom.grading import math as math_grader


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        (r"So the total is \boxed{7}.", "7"),
        (r"\boxed{\frac{1}{2}}", "0.5"),
        (r"\boxed{0.5}", r"\frac{1}{2}"),
        (r"\boxed{1,000}", "1000"),
        (r"\boxed{1000}", "1,000"),
        (r"\boxed{3\sqrt{3}}", r"3\sqrt{3}"),
        (r"\boxed{\dfrac{3}{4}}", r"\frac{3}{4}"),
        (r"The roots are $\boxed{3, 2}$", "2, 3"),
        ("The answer is 42.", "42"),
    ],
)
def test_math_equivalent_forms_are_correct(response, gold):
    g = grade_math(response, gold)
    assert g.status == "ok" and g.correct, g
    assert g.extracted


def test_math_wrong_answer_is_ok_but_incorrect():
    assert grade_math(r"I think \boxed{8}", "7") == Grade(False, "8", "ok")


def test_math_gold_is_parsed_whole():
    # A bare "3\sqrt{3}" parses as 3; the grader must not accept 3 for it.
    assert not grade_math(r"\boxed{3}", r"3\sqrt{3}").correct


def test_math_boxed_wins_over_earlier_answer_phrase():
    g = grade_math(r"Answer: 8. On reflection the result is \boxed{7}", "7")
    assert (g.correct, g.extracted) == (True, "7")


def test_math_think_block_is_ignored():
    g = grade_math(r"<think>maybe \boxed{7}</think> Final: \boxed{8}", "7")
    assert (g.correct, g.extracted, g.status) == (False, "8", "ok")


def test_math_last_close_think_wins():
    r = r"<think>\boxed{1}</think> \boxed{2} <think>again</think> \boxed{7}"
    assert grade_math(r, "7") == Grade(True, "7", "ok")


@pytest.mark.parametrize(
    "response", [r"<think>so \boxed{7}", r"<think>a</think> b <think> \boxed{7}"]
)
def test_math_unclosed_think_is_no_answer(response):
    assert grade_math(response, "7") == Grade(False, None, "no_answer")


@pytest.mark.parametrize("response", ["", "I do not know.", "<think>hmm</think>"])
def test_math_no_answer(response):
    assert grade_math(response, "7") == Grade(False, None, "no_answer")


@pytest.mark.parametrize("gold", ["", "   "])
def test_math_gold_unparseable(gold):
    g = grade_math(r"\boxed{7}", gold)
    assert g == Grade(False, None, "gold_unparseable", {"gold_problem": "does not parse"})


def test_math_upright_e_is_eulers_number():
    # math-verify alone cuts this gold down to 1: \boxed{1} was right and the true answer wrong.
    gold = r"1-\frac{1}{\mathrm{e}}"
    assert not grade_math(r"\boxed{1}", gold).correct
    assert grade_math(r"\boxed{1-\frac1e}", gold).correct
    assert grade_math(r"\boxed{\frac{e-1}{\mathrm{e}}}", gold).correct


@pytest.mark.parametrize(
    ("gold", "reason"),
    [
        (r"\boxed{1} no no no no no \boxed{2}", "parses to {1, 2} (read from '1,2')"),
        ("12:00", "parses to zoo, an undefined value"),
        (r"\boxed{3} apples", None),  # prose around one box: the box is the gold
        (
            r"1-\frac{1}{\mathrm{x}}",
            "parses to 1 (read from '1-\\\\frac{1}{'), not to its whole text",
        ),
    ],
)
def test_math_gold_that_is_not_its_text_is_a_gold_problem(gold, reason):
    g = grade_math(r"\boxed{3}", gold)
    if reason is None:
        assert (g.status, g.correct) == ("ok", True)
    else:
        assert (g.status, g.correct) == ("gold_unparseable", False), g
        assert reason in g.details["gold_problem"], g.details


def test_math_gold_boxes_are_not_joined_across_words():
    # Math-Verify's own tests expect this pair graded wrong: the gold's words are not a set.
    g = grade_math(r"\boxed{1,2}", r"\boxed{1} no no no no no \boxed{2}")
    assert g.status == "gold_unparseable" and not g.correct
    assert grade_math(r"\boxed{1,2}", r"\boxed{1} and \boxed{2}").correct


@pytest.mark.parametrize(
    "gold",
    [
        r"\frac{\sqrt{3}}{2}",
        r"\text{(C)}",
        r"5\text{ cm}^2",
        r"\left(3, \frac{\pi}{2}\right)",
        r"[2,5)",
        r"10\%",
        r"\$1.50",
        r"y = 2x + 3",
        r"x \in (0, 1]",
        r"\text{Even}",
        "a=1, b=2",
        r"30^\circ",
        r"\mathrm{cm}",
        r"\begin{pmatrix}1\\2\end{pmatrix}",
        "19, 46, and 82",
    ],
)
def test_math_golds_of_usual_forms_parse_whole(gold):
    g = grade_math(rf"\boxed{{{gold}}}", gold)
    assert (g.status, g.correct) == ("ok", True), g


def test_math_last_boxed_is_the_answer():
    response = r"\boxed{7} is wrong; the final answer is \boxed{8}"
    assert grade_math(response, "8") == Grade(True, "8", "ok")
    assert not grade_math(response, "7").correct
    # all: math-verify joins the boxes into the set {7, 8}
    assert not grade_math(response, "8", boxed="all").correct
    assert grade_math(response, "7, 8", boxed="all").correct


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        (r"\boxed{1\,000}", "1000"),
        (r"\boxed{1\ 000}", "1000"),
        (r"\boxed{1{,}000}", "1000"),
        (r"\boxed{12\,345\,678}", "12345678"),
        (r"\boxed{1000}", r"1\,000"),
        (r"\boxed{11,\!111}", "11111"),
    ],
)
def test_math_digit_groups(response, gold):
    assert grade_math(response, gold).correct


def test_math_short_groups_are_not_thousands():
    # "1,2" is a set and "1\,5" not a number with a thousands separator.
    assert grade_math(r"\boxed{1,2}", "1, 2").correct
    assert not grade_math(r"\boxed{1,2}", "12").correct
    assert not grade_math(r"\boxed{1\,5}", "15").correct


def test_math_timeout_is_reported(monkeypatch):
    monkeypatch.setattr(math_grader, "TIMEOUT_S", 1)
    g = grade_math(r"\boxed{9^{9^{9^{9}}}}", "7")
    assert g.status == "timeout" and not g.correct


def test_math_grades_from_a_thread():
    assert threading.current_thread() is threading.main_thread()
    cases = [(r"\boxed{0.5}", r"\frac{1}{2}"), (r"\boxed{8}", "7"), ("nothing", "7")]
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda c: grade_math(*c), cases))
    assert [(g.correct, g.status) for g in got] == [
        (True, "ok"),
        (False, "ok"),
        (False, "no_answer"),
    ]
