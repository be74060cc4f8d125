"""The offline procedural teacher: effort levels of clearly different lengths, its error rate, and
its answers to the kernel problems (reasoning and code, and slips)."""

import pytest

from stillroom.data import sources
from stillroom.grading.formats import extract_code
from stillroom.io import DataError
from stillroom.teachers import make_teacher
from stillroom.teachers.procedural import ProceduralTeacher

from ..conftest import kernel_records


def test_effort_levels_have_clearly_different_lengths():
    teacher = make_teacher("t", {"backend": "procedural", "error_rate": 0.0})
    probs = sources.generate("arithmetic", "a", 100, 1, max_operand=12) + sources.generate(
        "choice", "c", 50, 1, max_operand=12
    )
    mean = {
        e: sum(len(teacher.complete(p, e, 0, 0).text.split()) for p in probs) / len(probs)
        for e in ("low", "medium", "high", "xhigh")
    }
    assert (
        mean["low"]
        < 0.8 * mean["medium"]
        < mean["medium"]
        < mean["high"] / 1.2
        < mean["xhigh"] / 1.2
    )


def test_a_detail_spread_varies_a_prompts_samples_and_no_spread_keeps_them_alike():
    probs = sources.generate("arithmetic", "a", 40, 1, max_operand=12)
    alike = make_teacher("t", {"backend": "procedural"})
    spread = make_teacher("t", {"backend": "procedural", "detail_spread": 1})
    for p in probs:  # without a spread, samples are alike and as before
        assert len({alike.complete(p, "medium", i, 0).text for i in range(4)}) == 1
    lengths = [
        {spread.complete(p, "medium", i, 0).completion_tokens for i in range(4)} for p in probs
    ]
    assert sum(len(s) > 1 for s in lengths) > len(probs) / 2
    # within one level of medium's detail: from low's length up to high's, never xhigh's
    for p in probs:
        n = [spread.complete(p, "medium", i, 0).completion_tokens for i in range(8)]
        low, xhigh = (alike.complete(p, e, 0, 0).completion_tokens for e in ("low", "xhigh"))
        assert low <= min(n) and max(n) < xhigh
    assert spread.complete(probs[0], "high", 2, 0) == spread.complete(probs[0], "high", 2, 0)


def test_teacher_error_rate_and_determinism():
    teacher = make_teacher("t", {"backend": "procedural", "error_rate": {"low": 0.5, "high": 0.0}})
    probs = sources.generate("arithmetic", "a", 400, 1, max_operand=12)
    wrong = sum(
        f"\\boxed{{{p['answer']}}}" not in teacher.complete(p, "low", 0, 3).text for p in probs
    )
    assert 0.4 < wrong / len(probs) < 0.6
    assert all(f"\\boxed{{{p['answer']}}}" in teacher.complete(p, "high", 0, 3).text for p in probs)
    assert teacher.complete(probs[0], "low", 1, 3) == teacher.complete(probs[0], "low", 1, 3)
    with pytest.raises(ValueError, match="effort 'ultra'"):
        teacher.complete(probs[0], "ultra", 0, 0)
    with pytest.raises(DataError, match="no meta.op"):
        teacher.complete(
            {"prompt_id": "x", "source": "web", "prompt": "hi", "answer": "1", "kind": "math"},
            "low",
            0,
            0,
        )


def test_procedural_teacher_answers_with_reasoning_and_code_and_slips():
    rec = kernel_records(["layer_norm"])[0]
    teacher = ProceduralTeacher("p", {"backend": "procedural", "error_rate": 0.0})
    low, high = (teacher.complete(rec, e, 0, 1).text for e in ("low", "high"))
    assert low.startswith("<think>") and len(high) > len(low)
    assert "@triton.jit" in extract_code(high) and "layer_norm_kernel" in high
    slipped = ProceduralTeacher("p", {"backend": "procedural", "error_rate": 1.0})
    codes = {extract_code(slipped.complete(rec, "medium", i, 1).text) for i in range(12)}
    # the torch slip: the reference's own code as ModelNew
    assert any("triton" not in c for c in codes)
    assert any("0.5 *" in c for c in codes)  # the wrong-kernel slip
    with pytest.raises(DataError, match="no meta.op or meta.solution"):
        teacher.complete({**rec, "meta": {}}, "low", 0, 1)
