"""The kernel grader: the kernel track's reward of an answer as a grade, and what it records."""

from __future__ import annotations

from stillroom.grading import kernel
from stillroom.grading.kernel import grade, info, item_limit
from stillroom.grading.result import Options
from stillroom.kernels import KernelResult
from stillroom.teachers.procedural import ProceduralTeacher

from ..conftest import kernel_records


def test_a_grade_is_reward_one_with_every_flag_in_its_details():
    rec = kernel_records(["relu"])[0]
    good = ProceduralTeacher("p", {}).complete(rec, "medium", 0, 1).text
    options = Options.parse({"kernel": {"trials": 1, "timeout_s": 30}, "seed": 3})
    g = grade(good, rec["answer"], options)
    assert (g.correct, g.status) == (True, "ok")
    assert g.details["reward"] == 1.0 and g.details["launched_triton"] and g.details["answered"]
    none = grade("I would rather not.", rec["answer"], options)
    assert (none.correct, none.status, none.details["answered"]) == (False, "no_answer", False)


def test_the_worker_waits_longer_than_the_validator_and_the_grader_is_named(monkeypatch):
    monkeypatch.delenv("STILLROOM_KERNEL_KEY_FILE", raising=False)
    options = Options.parse({"kernel": {"timeout_s": 12.5}, "seed": 4})
    assert item_limit(options) == 85.0  # the validator reports its own timeouts (two jobs) first
    recorded = info(options)
    assert recorded["name"] == "kernel-validator"
    assert recorded["options"]["validator"] == {
        "device": "cpu",
        "trials": 3,
        "timeout_s": 12.5,
        "max_block_size": 2048,
        "max_threads_per_block": 1024,
        "max_instructions": 2000,
        "cases": ["mixed_sign", "negative", "zero", "large", "odd_shape"],
        "seed": 4,
    }
    assert recorded["options"]["replay_key_sha256"] is None  # no key file: random seeds


def test_a_failure_of_the_validator_itself_is_not_a_wrong_answer(monkeypatch):
    harness = KernelResult(0.0, 0.0, 0.0, False, False, False, reasons=["harness: x"])
    harness.status = "harness"
    monkeypatch.setattr(kernel, "score", lambda *a, **k: harness)
    g = grade("```python\nanything\n```", "gold", Options.parse({}))
    assert (g.correct, g.status, g.details["status"]) == (False, "harness", "harness")
