"""Verdicts do not depend on how busy the machine is: grading limits are CPU time (issue 43)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict

from stillroom.grading import grade_many

# A pathological answer (math-verify spends seconds on it) among ordinary ones of every in-process
# kind, and a code answer whose tests pass.
HANG = r"\boxed{9^{9^{9^{9}}}}"
IFEVAL = json.dumps([{"id": "change_case:english_lowercase"}])
ITEMS = [
    *((rf"The answer is \boxed{{{i}}}.", str(i if i % 3 else i + 1), "math") for i in range(8)),
    (HANG, "7", "math"),
    ("Answer: C", "C", "choice"),
    ("**Answer: B**", "C", "choice"),
    ("all lowercase here, as asked.", IFEVAL, "instructions"),
    ("Not All Lowercase.", IFEVAL, "instructions"),
    ("```python\ndef add(a, b):\n    return a + b\n```", "assert add(2, 3) == 5", "code"),
]


def _verdicts(grades) -> list[dict]:
    """What a grade says, without the code run's own wall-clock seconds."""
    out = []
    for g in grades:
        d = asdict(g)
        if d["details"]:
            d["details"] = {k: v for k, v in d["details"].items() if k != "seconds"}
        out.append(d)
    return out


def _hog(n: int) -> list[subprocess.Popen]:
    """``n`` processes spinning on the CPU, at normal priority."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def test_grading_under_a_cpu_hog_gives_the_same_verdicts():
    t0 = time.monotonic()
    idle = _verdicts(grade_many(ITEMS, workers=2, timeout_s=2.0, chunksize=2))
    idle_s = time.monotonic() - t0
    hogs = _hog(4 * (os.cpu_count() or 1))  # four spinners a core: a load far above the cores
    try:
        t0 = time.monotonic()
        loaded = _verdicts(grade_many(ITEMS, workers=2, timeout_s=2.0, chunksize=2))
        loaded_s = time.monotonic() - t0
    finally:
        for p in hogs:
            p.kill()
            p.wait()
    print(f"grading took {idle_s:.1f} s idle, {loaded_s:.1f} s under the hog")
    assert loaded == idle
    # the pathological answer ran out of CPU time both times: its own cost, not a wrong answer
    assert idle[8]["status"] == "timeout" and idle[8]["correct"] is False
    statuses = [v["status"] for v in idle]
    assert statuses.count("ok") == len(ITEMS) - 1 and "harness" not in statuses
    assert idle[-1]["correct"] and idle[-1]["details"]["run"] == "passed"
