"""Grading against the real math-verify: extraction, equivalence, think handling, choice formats, pools."""

from __future__ import annotations

import importlib.metadata
import json
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stillroom import grading
from stillroom.grading import GRADER_INFO, Grade, grade, grade_choice, grade_many, grade_math
from stillroom.io import read_jsonl, write_jsonl

# Hangs math-verify (sympy evaluates the tower; still running after 20 s) unless something stops it.
HANG = r"\boxed{9^{9^{9^{9}}}}"
TIMEOUT = Grade(False, None, "timeout")


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
    monkeypatch.setattr(grading, "TIMEOUT_S", 1)
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
        items.append(
            (
                rf"<think>\boxed{{{i + 1}}}</think> so \boxed{{{i}}}",
                str(i if i % 3 else i + 1),
                "math",
            )
        )
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


@pytest.mark.parametrize("ws", [" ", "\n"])
def test_choice_long_whitespace_does_not_backtrack(ws):
    # Plain \s* runs made "Answer:" + 200 spaces take minutes (catastrophic backtracking).
    t0 = time.perf_counter()
    assert grade_choice("Answer:" + ws * 20000 + ".", "B") == Grade(False, None, "no_answer")
    assert grade_choice(r"\boxed{" + ws * 20000 + "x", "B") == Grade(False, None, "no_answer")
    assert grade_choice("The answer is" + ws * 20000 + "(B)", "B") == Grade(True, "B", "ok")
    assert time.perf_counter() - t0 < 1


def test_choice_letters_a_to_j_in_workers():
    letters = "ABCDEFGHIJ"
    items = [(f"The answer is ({L})", "J", "choice") for L in letters] + [
        (r"\boxed{J}", "K", "choice")
    ]
    got = grade_many(items, workers=2, letters=letters)
    assert [g.extracted for g in got] == [*letters, None]
    assert [g.correct for g in got] == [False] * 9 + [True, False]
    assert got[-1].status == "gold_unparseable"
    with pytest.raises(ValueError, match="distinct"):
        grade_many(items, letters="AAB")


def _warm_pool():
    grade_many(
        [(r"\boxed{1}", "1", "math")], workers=1
    )  # starts the forkserver once per test process


@pytest.mark.parametrize("workers", [1, 2])
def test_stuck_worker_is_killed_within_its_timeout(workers):
    _warm_pool()
    items = [(rf"\boxed{{{i}}}", str(i if i % 2 else i + 1), "math") for i in range(12)]
    items.append(("Answer: C", "C", "choice"))
    hung = (
        {0, 3} if workers == 2 else {3}
    )  # with 2 workers, the first item of each one's first batch
    for i in hung:
        items[i] = (HANG, "7", "math")
    t0 = time.perf_counter()
    got = grade_many(items, workers=workers, timeout_s=1.0, chunksize=3)
    elapsed = time.perf_counter() - t0
    # Killed at the hard limit, not by math-verify's own 5 s alarm (off in workers), and not much later.
    assert 1.0 <= elapsed < 1.0 + 3.0, elapsed
    assert [i for i, g in enumerate(got) if g.status == "timeout"] == sorted(hung)
    assert all(got[i] == TIMEOUT for i in hung)
    # Every other item graded, in order, by a replacement worker where needed.
    assert [g for i, g in enumerate(got) if i not in hung] == [
        grade(*it) for i, it in enumerate(items) if i not in hung
    ]


def test_pool_enforces_timeouts_when_called_from_a_thread():
    # Outside the main thread math-verify can set no alarm; the killable worker is the only limit.
    _warm_pool()
    items = [(HANG, "7", "math"), (r"\boxed{\frac{1}{2}}", "0.5", "math")]
    with ThreadPoolExecutor(1) as pool:
        got = pool.submit(grade_many, items, workers=1, timeout_s=1.0).result(timeout=30)
    assert got == [TIMEOUT, Grade(True, "\\frac{1}{2}", "ok")]


def _cpu_s(pid):
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_worker_that_dies_marks_its_item_crashed_and_is_replaced():
    _warm_pool()
    items = [(HANG, "7", "math"), (r"\boxed{7}", "7", "math")]
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(grade_many, items, workers=1, timeout_s=60.0, chunksize=1)
        # Once the worker has burnt more CPU than its warm-up, it is on HANG: kill it as the OOM killer would.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            worker = [
                p.pid for p in multiprocessing.active_children() if p.name == "stillroom-grader"
            ]
            if worker and _cpu_s(worker[0]) > 1.5:
                break
            time.sleep(0.05)
        os.kill(worker[0], signal.SIGKILL)
        got = future.result(timeout=30)
    assert got == [Grade(False, None, "crashed"), Grade(True, "7", "ok")]


def test_in_process_path_and_bad_timeout():
    items = [(r"\boxed{7}", "7", "math"), ("Answer: B", "B", "choice")]
    assert grade_many(items, workers=0) == [grade(*it) for it in items]
    with pytest.raises(ValueError, match="timeout_s"):
        grade_many(items, workers=1, timeout_s=0)


def test_run_records_grader_and_counts_gold_failures_apart(tmp_path):
    rows = [
        {"key": "a", "response": r"\boxed{7}", "answer": "7", "kind": "math"},
        {"key": "b", "response": r"\boxed{8}", "answer": "7", "kind": "math"},
        {"key": "c", "response": r"\boxed{7}", "answer": "", "kind": "math"},  # gold does not parse
        {"key": "d", "response": HANG, "answer": "7", "kind": "math"},
        {"key": "e", "response": None, "answer": "7", "kind": "math"},  # request failed for good
        {"key": "f", "response": "The answer is (J)", "answer": "J", "kind": "choice"},
        {"key": "g", "response": "Answer: A", "answer": "Z", "kind": "choice"},
    ]
    src, out, logs = tmp_path / "samples.jsonl", tmp_path / "graded.jsonl", []
    write_jsonl(src, rows)
    m = grading.run(
        samples=str(src),
        out_graded=str(out),
        params={"letters": "ABCDEFGHIJ", "grade_timeout_s": 1},
        threads=2,
        log=logs.append,
    )
    assert {
        k: m[k]
        for k in (
            "samples",
            "correct",
            "wrong",
            "no_answer",
            "timeout",
            "crashed",
            "gold_unparseable",
        )
    } == {
        "samples": 7,
        "correct": 2,
        "wrong": 1,
        "no_answer": 1,
        "timeout": 1,
        "crashed": 0,
        "gold_unparseable": 2,
    }
    assert any("2 samples have a gold answer that does not parse" in line for line in logs)
    graded = read_jsonl(out)
    assert [r["grade"]["status"] for r in graded] == [
        "ok",
        "ok",
        "gold_unparseable",
        "timeout",
        "no_answer",
        "ok",
        "gold_unparseable",
    ]
    math_grader, choice_grader = graded[0]["grader"], graded[-1]["grader"]
    assert all(
        r["grader"] == (math_grader if r["kind"] == "math" else choice_grader) for r in graded
    )
    assert math_grader["name"] == "math-verify"
    assert math_grader["version"] == importlib.metadata.version("math-verify")
    assert (
        math_grader["options"]["timeout_s"] == 1 and math_grader["options"]["float_rounding"] == 6
    )
    assert choice_grader["name"] == "choice" and choice_grader[
        "version"
    ] == importlib.metadata.version("stillroom")
    assert choice_grader["options"]["letters"] == "ABCDEFGHIJ"
    assert m["graders"] == {"math": math_grader, "choice": choice_grader}


def test_off_target_kinds_grade_through_the_worker_pool():
    """IFEval-style instructions and sandboxed code run through the same pool as math and choice."""
    import json as _json

    items = [
        ("all lowercase here", _json.dumps([{"id": "case_lowercase"}]), "instructions"),
        ("Sure!\nall lowercase here", _json.dumps([{"id": "case_lowercase"}]), "instructions"),
        (
            "```python\ndef add(a, b):\n    return a + b\n```",
            _json.dumps({"tests": "assert add(2, 3) == 5", "entry_point": "add"}),
            "code",
        ),
        (
            "```python\ndef add(a, b):\n    while True: pass\n```",
            _json.dumps({"tests": "assert add(2, 3) == 5", "entry_point": "add"}),
            "code",
        ),
        ("\\boxed{5}", "5", "math"),
    ]
    lower, preamble, good, loops, math = grading.grade_many(
        items, workers=1, timeout_s=grading.CODE_TIMEOUT_S + 3
    )
    assert lower.correct and not preamble.correct and preamble.details["prompt_loose"]
    assert good.correct and good.details["run"] == "passed"
    assert not loops.correct and loops.status == "timeout" and loops.details["run"] == "timeout"
    assert math.correct and math.details is None
