"""The kernel track's grades reproduce with a key file (and only with one), and grading leaves no
job directories behind (issue 43)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import kernel_records

REPO = Path(__file__).resolve().parents[2]
# Grades a kernel answer in a grading worker (the grade stage's path), printing the records.
SCRIPT = """
import json, sys
from dataclasses import asdict
from stillroom.grading.workers import grade_many
from stillroom.grading.kernel import info
from stillroom.grading.result import Options
if __name__ == "__main__":
    response, gold = json.load(sys.stdin)
    kernel = {"trials": 1, "timeout_s": 60}
    grades = grade_many([(response, gold, "kernel")], workers=1, timeout_s=200, kernel=kernel)
    grader = info(Options.parse({"kernel": kernel}))
    print(json.dumps({"grade": asdict(grades[0]), "grader": grader}, sort_keys=True))
"""


def _grade(answer: tuple[str, str], tmp: Path, key: Path | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "STILLROOM_KERNEL_KEY_FILE"}
    env.update(TMPDIR=str(tmp), PYTHONPATH=str(REPO))
    if key is not None:
        env["STILLROOM_KERNEL_KEY_FILE"] = str(key)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], input=json.dumps(answer), env=env, cwd=REPO,
        capture_output=True, text=True, timeout=500, check=True,
    )  # fmt: skip
    return out.stdout


@pytest.mark.slow
def test_kernel_grades_are_byte_identical_with_a_key_and_leave_no_job_directories(tmp_path):
    from stillroom.teachers.procedural import ProceduralTeacher

    rec = kernel_records(["relu"])[0]
    answer = (ProceduralTeacher("p", {}).complete(rec, "medium", 0, 1).text, rec["answer"])
    key = tmp_path / "key"
    key.write_text("9f2c4e1a7b3d5f60718293a4b5c6d7e8f9012345")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    first, second = (_grade(answer, tmp, key) for _ in range(2))
    assert first == second
    record = json.loads(first)
    assert record["grade"]["status"] == "ok" and record["grade"]["correct"]
    # the key by its digest only
    recorded = record["grader"]["options"]["replay_key_sha256"]
    assert len(recorded) == 64 and key.read_text() not in first
    # every grading job removed its directories, the kernel jobs' among them
    assert list(tmp.iterdir()) == []
    unkeyed = [json.loads(_grade(answer, tmp, None)) for _ in range(2)]
    seeds = {r["grade"]["details"]["replay_seed"] for r in unkeyed}
    assert len(seeds) == 2 and record["grade"]["details"]["replay_seed"] not in seeds
    assert unkeyed[0]["grader"]["options"]["replay_key_sha256"] is None
    assert list(tmp.iterdir()) == []


def test_validator_seeds_follow_the_key_and_the_candidate(tmp_path, monkeypatch):
    from stillroom.kernels import validator

    key = tmp_path / "key"
    key.write_bytes(os.urandom(32))
    monkeypatch.setenv(validator.KEY_FILE_ENV, str(key))
    draw = validator._seeds("problem", "candidate", 0)
    again = validator._seeds("problem", "candidate", 0)
    purposes = ("replay", "extraction 0", "extraction 1", "order")
    assert [draw(p) for p in purposes] == [again(p) for p in purposes]
    assert len({draw(p) for p in purposes}) == 4 and all(0 <= draw(p) < 2**62 for p in purposes)
    assert validator._seeds("problem", "candidate 2", 0)("replay") != draw("replay")
    assert validator._seeds("problem", "candidate", 1)("replay") != draw("replay")
    key.write_bytes(b"")
    validator._key.cache_clear()
    with pytest.raises(ValueError, match="STILLROOM_KERNEL_KEY_FILE.*is empty"):
        validator._seeds("problem", "candidate", 0)
    monkeypatch.delenv(validator.KEY_FILE_ENV)
    random = validator._seeds("problem", "candidate", 0)
    assert random("replay") != random("replay") and validator.key_digest() is None
