"""The kernel reward every stage takes: no code block, nothing runs; otherwise the validator's
execution x rule reward of the answer's ModelNew block."""

from __future__ import annotations

from stillroom.config import ValidatorOptions
from stillroom.grading.kernel import score_answer
from stillroom.kernels.reward import NO_CODE, score, timed_out
from stillroom.teachers.procedural import ProceduralTeacher

from ..conftest import kernel_records


def test_an_answer_without_code_scores_nothing_without_running():
    result = score_answer(
        "not even a problem", "Let me think.</think> No code today.", ValidatorOptions()
    )
    assert score("not even a problem", None, ValidatorOptions()) == result
    assert (result.reward, result.answered, result.reasons) == (0.0, False, [NO_CODE])
    assert not timed_out(result)


def test_the_reference_solution_scores_one_and_a_hang_times_out():
    rec = kernel_records(["relu"])[0]
    answer = ProceduralTeacher("p", {}).complete(rec, "high", 0, 1).text
    options = ValidatorOptions(trials=1, timeout_s=20)
    assert score_answer(rec["answer"], answer, options, seed=1).reward == 1.0
    hang = answer.replace("        return out", "        while True:\n            pass", 1)
    assert hang != answer
    result = score_answer(rec["answer"], hang, ValidatorOptions(trials=1, timeout_s=2))
    assert result.reward == 0.0 and timed_out(result)
