"""Grading against the real math-verify: extraction, equivalence, think handling, choice formats, pools."""

from __future__ import annotations

import importlib.metadata
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from stillroom import grading
from stillroom.grading import GRADER_INFO, Grade, grade, grade_choice, grade_many, grade_math


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


@pytest.mark.parametrize("response", [r"<think>so \boxed{7}", r"<think>a</think> b <think> \boxed{7}"])
def test_math_unclosed_think_is_no_answer(response):
    assert grade_math(response, "7") == Grade(False, None, "no_answer")


@pytest.mark.parametrize("response", ["", "I do not know.", "<think>hmm</think>"])
def test_math_no_answer(response):
    assert grade_math(response, "7") == Grade(False, None, "no_answer")


@pytest.mark.parametrize("gold", ["", "   "])
def test_math_gold_unparseable(gold):
    assert grade_math(r"\boxed{7}", gold) == Grade(False, None, "gold_unparseable")


def test_math_timeout_is_reported(monkeypatch):
    monkeypatch.setattr(grading, "TIMEOUT_S", 1)
    g = grade_math(r"\boxed{9^{9^{9^{9}}}}", "7")
    assert g.status == "timeout" and not g.correct


def test_math_grades_from_a_thread():
    assert threading.current_thread() is threading.main_thread()
    cases = [(r"\boxed{0.5}", r"\frac{1}{2}"), (r"\boxed{8}", "7"), ("nothing", "7")]
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda c: grade_math(*c), cases))
    assert [(g.correct, g.status) for g in got] == [(True, "ok"), (False, "ok"), (False, "no_answer")]


@pytest.mark.parametrize(
    "response",
    [
        r"\boxed{B}",
        r"so $\boxed{(B)}$",
        r"\boxed{\text{B}}",
        "Answer: B",
        "answer: (B)",
        "The answer is B.",
        "The correct answer is (B)",
        "**Answer:** B",
        "**Answer**: **B**",
        "Final answer: (B)",
        "the answer is **(B)**",
        "ANSWER IS B",
        "The answer is: B",
    ],
)
def test_choice_accepted_forms(response):
    assert grade_choice(response, "B") == Grade(True, "B", "ok")


def test_choice_wrong_letter_and_last_occurrence_wins():
    assert grade_choice("Answer: A", "B") == Grade(False, "A", "ok")
    assert grade_choice(r"The answer is A. Wait, no: \boxed{C}. Final answer: B", "B").extracted == "B"
    assert grade_choice(r"Answer: B. Hmm, actually the answer is (D)", "B") == Grade(False, "D", "ok")


@pytest.mark.parametrize(
    "response",
    ["I'd pick B.", "Answer: Both are plausible", "answer is c", "Answer: E", r"\boxed{A+B}", "<think>Answer: B"],
)
def test_choice_no_answer(response):
    assert grade_choice(response, "B") == Grade(False, None, "no_answer")


def test_choice_think_block_is_ignored():
    assert grade_choice("<think>Answer: B</think> Answer: C", "B") == Grade(False, "C", "ok")


def test_choice_ten_letters():
    letters = "ABCDEFGHIJ"
    assert grade_choice("The answer is (J)", "J", letters) == Grade(True, "J", "ok")
    assert grade_choice("The answer is (J)", "J") == Grade(False, None, "gold_unparseable")
    assert grade_choice("Answer: J", "A") == Grade(False, None, "no_answer")


@pytest.mark.parametrize("gold", ["E", "AB", "", "b"])
def test_choice_gold_unparseable(gold):
    assert grade_choice("Answer: B", gold) == Grade(False, None, "gold_unparseable")


def test_grade_dispatch_and_unknown_kind():
    assert grade(r"\boxed{7}", "7", "math").correct
    assert grade("Answer: (J)", "J", "choice", letters="ABCDEFGHIJ").correct
    with pytest.raises(ValueError, match="essay"):
        grade("x", "y", "essay")
    with pytest.raises(ValueError, match="essay"):
        grade_many([(r"\boxed{7}", "7", "math"), ("x", "y", "essay")])


def test_grade_many_workers_agree_and_keep_order():
    items = []
    for i in range(60):
        items.append((rf"<think>\boxed{{{i + 1}}}</think> so \boxed{{{i}}}", str(i if i % 3 else i + 1), "math"))
        items.append((f"The answer is {'ABCD'[i % 4]}", "ABCD"[i % 3], "choice"))
    items.append(("<think>unfinished", "1", "math"))
    serial = grade_many(items, workers=1)
    parallel = grade_many(items, workers=2, chunksize=8)
    assert serial == parallel
    assert serial == [grade(*item) for item in items]
    assert [g.extracted for g in serial[:4]] == ["0", "A", "1", "B"]
    assert [g.correct for g in serial[:4]] == [False, True, True, True]
    assert serial[-1].status == "no_answer"
    assert grade_many([], workers=2) == []


def test_grader_info_is_recordable():
    assert GRADER_INFO["math_verify"] == importlib.metadata.version("math-verify")
    assert json.loads(json.dumps(GRADER_INFO)) == GRADER_INFO
