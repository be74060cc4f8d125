"""Other graders' cases (tests/grading/data/outside_grading_cases.json: open-r1, Qwen2.5-Math,
MindSpeed-RL, rllm, SkyRL, simple-evals, lm-eval's Minerva/MMLU-Pro/GPQA, PRM800K, each with its
repository, commit and where the case is) through the project's graders at their defaults.

Every case must give the verdict its source expects ("correct"; "incorrect", which is wrong or no
answer; "not_graded", a gold that does not parse) unless it is in DISAGREE by id with the project's
verdict and why the project's convention differs; a listed case that starts to agree must be taken
off the list."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stillroom.grading import grade_choice, grade_math

DATA = json.loads((Path(__file__).parent / "data" / "outside_grading_cases.json").read_text())
CASES = DATA["cases"]

_TOLERANCE = (
    "the source accepts numbers within relative 1e-4 (Qwen2.5-Math's numeric_equal); the project "
    "compares a whole gold exactly and any other within relative 5e-6"
)
_FORMAT = (
    "the source requires its own answer format ({}); the project reads an answer stated without it"
)
_LAST = "the source takes the first stated answer; the project the last, the model's final word"
_VALUES = "the source compares answers as written ({}); the project compares their values"
_AFTER_BOX = (
    "the source reads the answer line to the end, so text glued after the box spoils it; the "
    "project reads the last \\boxed{}"
)
_BARE_UNIT = (
    "the gold has a unit as a bare word outside \\text{{}} ({}), which math-verify's parse leaves "
    "out: a gold problem, not graded"
)
# id -> (the project's verdict, why it differs from the source's)
DISAGREE: dict[str, tuple[str, str]] = {
    "qwen25math#4": (
        "incorrect",
        "interval ends: 2.6667 vs 8/3 is 1.25e-5 apart; Qwen2.5-Math allows relative 1e-4, the "
        "project compares inside intervals as math-verify does (6 decimal places)",
    ),
    "qwen25math#5": (
        "incorrect",
        "Qwen2.5-Math also accepts the gold times or divided by 100 (a percentage); the project "
        "takes 50 for 50, and reads 50% as 0.5",
    ),
    "qwen25math#6": ("incorrect", _TOLERANCE),
    "mindspeed-rl#5": ("incorrect", _TOLERANCE),
    "mindspeed-rl#9": (
        "incorrect",
        "plain text outside $...$: math-verify's expression extraction reads the 2 of '2x + 3'; "
        "the source's test passes its own 'Answer:' pattern",
    ),
    "mindspeed-rl#13": ("correct", _FORMAT.format("DAPO's minerva mode: an 'Answer:' line")),
    "rllm#4": ("correct", _FORMAT.format("a </think> before the answer")),
    "rllm#5": ("correct", _FORMAT.format("a \\boxed{} answer")),
    "rllm#13": ("correct", _FORMAT.format("a </think> before the answer")),
    "skyrl#5": ("correct", _VALUES.format("0.5 is not \\frac{1}{2}")),
    "skyrl#8": ("correct", _AFTER_BOX),
    "skyrl#10": ("correct", _AFTER_BOX),
    "skyrl#13": ("correct", _FORMAT.format("GSM8K's '#### 42'")),
    "simple-evals#5": (
        "correct",
        "simple-evals' checker allows only trivial simplifications, so 3245/5 is not 649; the "
        "project compares values",
    ),
    "simple-evals#7": ("not_graded", _BARE_UNIT.format("'degrees'")),
    "simple-evals#14": ("correct", _LAST),
    "lm-eval-minerva#15": (
        "correct",
        _FORMAT.format("Minerva's 'Final Answer: The final answer is ...' line"),
    ),
    "lm-eval-mmlu-pro#3": ("incorrect", _LAST),
    "lm-eval-mmlu-pro#4": ("correct", _FORMAT.format("MMLU-Pro's 'answer is (X)'")),
    "lm-eval-gpqa#2": (
        "incorrect",
        "lm-eval's flexible GPQA extraction takes the last '(X)' anywhere; the project needs the "
        "letter stated as the answer ('answer is', 'answer:', a box)",
    ),
    "prm800k#2": ("correct", _VALUES.format("an unreduced fraction is wrong")),
    "prm800k#3": ("correct", _VALUES.format("an integer gold needs an integer answer")),
    "prm800k#5": ("not_graded", _BARE_UNIT.format("'cm'")),
    "prm800k#8": (
        "incorrect",
        "PRM800K reads 'million' as *10^6; the project reads the number before the word",
    ),
}


def verdict(case: dict) -> str:
    """What the project's grader says of ``case``, in the sources' terms."""
    pred = rf"\boxed{{{case['pred']}}}" if case.get("pred_is") == "answer" else case["pred"]
    grades = [
        grade_choice(pred, gold, case["letters"])
        if case["kind"] == "choice"
        else grade_math(pred, gold)
        for gold in case.get("golds") or [case["gold"]]
    ]
    if any(g.correct for g in grades):
        return "correct"
    if all(g.status == "gold_unparseable" for g in grades):
        return "not_graded"
    assert all(g.status in ("ok", "no_answer", "gold_unparseable") for g in grades), grades
    return "incorrect"


def test_outside_cases_are_whole():
    assert len(CASES) == 100 and len({c["id"] for c in CASES}) == len(CASES)
    assert {c["source"] for c in CASES} == set(DATA["sources"])
    assert set(DISAGREE) <= {c["id"] for c in CASES}
    assert all(c["expected"] in ("correct", "incorrect", "not_graded") for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_outside_case(case):
    expected = DISAGREE[case["id"]][0] if case["id"] in DISAGREE else case["expected"]
    assert verdict(case) == expected, case
