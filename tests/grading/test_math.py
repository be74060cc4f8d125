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
    assert grade_math(r"\boxed{7}", gold) == Grade(False, None, "gold_unparseable")


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
