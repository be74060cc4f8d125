"""Grading in killable worker processes: agreement with in-process grading, order, hard timeouts,
crashed workers replaced, and every kind (instructions, code) through the same pool."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stillroom.grading import Grade, grade, grade_many
from stillroom.grading import code as code_grader
from stillroom.sandbox import backstop_s

# Hangs math-verify (sympy evaluates the tower without end) unless something stops it.
HANG = r"\boxed{9^{9^{9^{9}}}}"
TIMEOUT = Grade(False, None, "timeout")


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


def test_repeated_items_graded_once(monkeypatch):
    """A peaked model repeats its answers: each distinct item is graded once, every copy gets its
    grade, in input order."""
    from stillroom.grading import math as math_grader

    calls = []
    real = math_grader.grade
    monkeypatch.setattr(math_grader, "grade", lambda *a: calls.append(a[:2]) or real(*a))
    items = [(r"\boxed{7}", "7", "math"), (r"\boxed{8}", "7", "math")] * 3 + [
        (r"\boxed{7}", "8", "math")
    ]
    got = grade_many(items, workers=0)
    assert [g.correct for g in got] == [True, False] * 3 + [False]
    assert sorted(calls) == sorted({(r, g) for r, g, _ in items})
    # through the worker pool too
    assert grade_many(items, workers=2) == got


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
    # Stopped by its CPU limit (1 to 2 CPU seconds: RLIMIT_CPU counts whole ones), not by the
    # wall-clock backstop nor math-verify's own 5 s alarm (off in workers); how long that took on
    # the wall clock depends on the machine's load.
    assert 1.0 <= elapsed < backstop_s(1.0), elapsed
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
        # Once the worker has burnt more CPU than its warm-up, it is on HANG: kill it as the OOM
        # killer would.
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


@pytest.mark.slow
def test_off_target_kinds_grade_through_the_worker_pool():
    """IFEval's instructions (lm-eval imported before the first item is timed) and sandboxed code
    run through the same pool as math and choice."""
    import json as _json

    lower = "all of this answer is written in lowercase english letters."
    items = [
        (lower, _json.dumps([{"id": "change_case:english_lowercase"}]), "instructions"),
        ("Sure!\n" + lower, _json.dumps([{"id": "change_case:english_lowercase"}]), "instructions"),
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
    lower, preamble, good, loops, math = grade_many(
        items, workers=1, timeout_s=code_grader.TIMEOUT_S + 3
    )
    assert lower.correct and not preamble.correct and preamble.details["prompt_loose"]
    assert good.correct and good.details["run"] == "passed"
    assert not loops.correct and loops.status == "timeout" and loops.details["run"] == "timeout"
    assert math.correct and math.details is None
