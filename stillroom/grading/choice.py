"""Multiple-choice answers: the last stated letter, matched case-sensitively against the gold.

The letters are each item's own, read from the options its prompt lists (a row may have more
than four), so that a gold letter outside them is a gold problem rather than a wrong answer."""

from __future__ import annotations

import functools
import importlib.metadata
import re
from typing import Any

from ..config.base import DEFAULT_LETTERS
from .formats import answer_text
from .result import NO_ANSWER, Grade, Options, gold_problem


@functools.lru_cache(maxsize=32)
def _choice_regex(letters: str) -> re.Pattern:
    if not letters or len(set(letters)) != len(letters) or any(c.isspace() for c in letters):
        raise ValueError(f"choice letters must be distinct non-space characters, got {letters!r}")
    x = "[" + "".join(re.escape(c) for c in letters) + "]"
    # Possessive \s*+: with plain \s* the runs between optional tokens split a long whitespace run
    # in O(n^k) ways, and a long run after "Answer:" backtracks for minutes. Nothing after a run can
    # start with whitespace (letters never do), so giving none back never loses a match.
    boxed = rf"\\boxed\{{\s*+(?:\\text(?:bf)?\{{)?\s*+\(?\s*+({x})\s*+\)?\s*+\}}"
    # What may wrap the letter after "answer:" or "answer is": markdown bold, math dollars,
    # parentheses, \textbf{, \text{, \mathbf{, \mathrm{, \boxed{ ("Answer: $B$", "**B**").
    wrap = r"(?:\s|\*\*|\$|\(|\\(?:textbf|text|mathbf|mathrm|boxed)\{)*+"
    stated = rf"(?i:answer)\s*+(?:\*\*)?\s*+(?:(?i:is)\b|:)\s*+:?{wrap}({x})(?!\w)"
    return re.compile(f"{boxed}|{stated}")


# An option's label: "(A) ..." anywhere, or "A) ...", "A. ...", "A: ..." at the start of a line.
_LABEL = re.compile(r"(?<!\S)\(([A-Z])\)(?=\s)|^[ \t]*([A-Z])[).:](?=\s)", re.MULTILINE)


def item_letters(prompt: str) -> str | None:
    """The letters of the options ``prompt`` lists: its last run of labels A, B, C... in order
    (at least two), or None when it lists none."""
    runs, run = [], ""
    for m in _LABEL.finditer(prompt):
        letter = m.group(1) or m.group(2)
        if letter == "A":
            runs.append(run)
            run = "A"
        elif run and ord(letter) == ord(run[-1]) + 1:
            run += letter
    runs.append(run)
    return next((r for r in reversed(runs) if len(r) >= 2), None)


def grade_choice(response: str, gold: str, letters: str = DEFAULT_LETTERS) -> Grade:
    """The last '\\boxed{X}', 'answer: X' or 'answer is X'; with letters "ABCD", "answer is c" is
    no answer."""
    gold = gold.strip()
    if len(gold) != 1 or gold not in letters:
        return gold_problem(f"gold {gold!r} is not one of the item's letters {letters}")
    text = answer_text(response)
    matches = list(_choice_regex(letters).finditer(text)) if text is not None else []
    if not matches:
        return NO_ANSWER
    letter = matches[-1].group(1) or matches[-1].group(2)
    return Grade(letter == gold, letter, "ok")


def grade(response: str, gold: str, options: Options) -> Grade:
    return grade_choice(response, gold, options.letters)


def info(options: Options) -> dict[str, Any]:
    return {  # stillroom's own rule, so stillroom's version
        "name": "choice",
        "version": importlib.metadata.version("stillroom"),
        "options": {
            "letters": options.letters,
            "item_letters": "each item's own, from the options its prompt lists, else letters",
            "case_sensitive": True,
        },
    }
