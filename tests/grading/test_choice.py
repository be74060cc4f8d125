"""Multiple-choice answers: the accepted forms, the last stated letter, letter sets, no
backtracking."""

from __future__ import annotations

import time

import pytest

from stillroom.grading import Grade, grade_choice


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
    assert (
        grade_choice(r"The answer is A. Wait, no: \boxed{C}. Final answer: B", "B").extracted == "B"
    )
    assert grade_choice(r"Answer: B. Hmm, actually the answer is (D)", "B") == Grade(
        False, "D", "ok"
    )


@pytest.mark.parametrize(
    "response",
    [
        "I'd pick B.",
        "Answer: Both are plausible",
        "answer is c",
        "Answer: E",
        r"\boxed{A+B}",
        "<think>Answer: B",
    ],
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


@pytest.mark.parametrize("ws", [" ", "\n"])
def test_choice_long_whitespace_does_not_backtrack(ws):
    # Plain \s* runs made "Answer:" + 200 spaces take minutes (catastrophic backtracking).
    t0 = time.perf_counter()
    assert grade_choice("Answer:" + ws * 20000 + ".", "B") == Grade(False, None, "no_answer")
    assert grade_choice(r"\boxed{" + ws * 20000 + "x", "B") == Grade(False, None, "no_answer")
    assert grade_choice("The answer is" + ws * 20000 + "(B)", "B") == Grade(True, "B", "ok")
    assert time.perf_counter() - t0 < 1
