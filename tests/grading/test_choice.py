"""Multiple-choice answers: the accepted forms, the last stated letter, letter sets, no
backtracking."""

from __future__ import annotations

import time

import pytest

from stillroom.grading import Grade, grade_choice
from stillroom.grading.choice import item_letters


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
        # simple-evals' ANSWER_PATTERN_MULTICHOICE allows the letter in $: Answer\s*:\s*\$?X\$?
        "Answer: $B$",
        "Answer: $\\mathrm{B}$",
        "Answer: **B**",
        "**Answer: B**",
        "Answer: \\textbf{B}",
        "Answer: $\\textbf{(B)}$",
        "The answer is $\\boxed{B}$.",
        "The answer is \\text{(B)}",
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
        "Answer: $Both$",
        "Answer: **Bob**",
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
    g = grade_choice("The answer is (J)", "J")
    assert g == Grade(False, None, "gold_unparseable", {"gold_problem": GOLD_J})
    assert grade_choice("Answer: J", "A") == Grade(False, None, "no_answer")


GOLD_J = "gold 'J' is not one of the item's letters ABCD"


@pytest.mark.parametrize("gold", ["E", "AB", "", "b"])
def test_choice_gold_unparseable(gold):
    g = grade_choice("Answer: B", gold)
    assert (g.correct, g.extracted, g.status) == (False, None, "gold_unparseable")
    assert g.details == {"gold_problem": f"gold {gold!r} is not one of the item's letters ABCD"}


@pytest.mark.parametrize(
    ("prompt", "letters"),
    [
        ("Which is largest? (A) 78 (B) 37 (C) 51 (D) 29", "ABCD"),
        ("Pick one.\n\n(A) x\n(B) y\n(C) z\n(D) w\n(E) v\n(F) u", "ABCDEF"),
        ("Which is sodium?\nA) Na\nB) So\nC) N\nAnswer with the letter.", "ABC"),
        (
            "Q?\nA. one\nB. two\nC. three\nD. four\nE. five\nF. six\nG. 7\nH. 8\nI. 9\nJ. 10",
            "ABCDEFGHIJ",
        ),
        # a reference to "(A)" in the question is not the listing
        ("If (A) holds, which follows?\n(A) p\n(B) q", "AB"),
        ("What is 2 + 2?", None),
        ("Is A) true?", None),
    ],
)
def test_item_letters_from_the_prompt(prompt, letters):
    assert item_letters(prompt) == letters


def test_item_letters_grade_a_gold_past_d():
    # A ten-option item: E..J are answers, not gold problems, whatever the configured letters.
    prompt = "Q?\n" + "\n".join(f"({c}) option {c}" for c in "ABCDEFGHIJ")
    assert grade_choice("Answer: (H)", "H", item_letters(prompt)) == Grade(True, "H", "ok")
    assert grade_choice("Answer: (G)", "H", item_letters(prompt)) == Grade(False, "G", "ok")


@pytest.mark.parametrize("ws", [" ", "\n"])
def test_choice_long_whitespace_does_not_backtrack(ws):
    # Plain \s* runs made "Answer:" + 200 spaces take minutes (catastrophic backtracking).
    t0 = time.perf_counter()
    assert grade_choice("Answer:" + ws * 20000 + ".", "B") == Grade(False, None, "no_answer")
    assert grade_choice(r"\boxed{" + ws * 20000 + "x", "B") == Grade(False, None, "no_answer")
    assert grade_choice("The answer is" + ws * 20000 + "(B)", "B") == Grade(True, "B", "ok")
    assert time.perf_counter() - t0 < 1
