"""The code grader: gold formats, pass/fail, entry points, timeouts and clean-up."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stillroom.grading.code import grade_code, parse_code_gold, run_program
from stillroom.io import read_jsonl

from ..conftest import REPO

GOLD = json.dumps(
    {"entry_point": "add", "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}
)


ADD = "def add(a, b):\n    return a + b\n"


def fenced(code: str, lang: str = "python") -> str:
    return f"Here is my solution:\n```{lang}\n{code}```\nIt adds the numbers."


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """Where sandboxes are made; every test checks it is left empty (no leftover temporary
    directories)."""
    sandboxes = tmp_path / "sandboxes"
    sandboxes.mkdir()
    yield sandboxes
    assert list(sandboxes.iterdir()) == []


def test_gold_formats():
    assert parse_code_gold("assert f(1) == 1\n") == ("assert f(1) == 1\n", None)
    assert parse_code_gold('{"tests": "assert f()", "entry_point": "f"}') == ("assert f()", "f")
    assert parse_code_gold(GOLD)[0] == "assert add(1, 2) == 3\nassert add(-1, 1) == 0"
    for bad, message in [
        ('{"tests": "assert f()",', "not valid JSON"),
        ('{"test": "assert 1"}', "keys 'tests'"),
        ('{"tests": "assert 1", "entry_point": "f g"}', "identifier"),
        ("   ", "no tests"),
        ("assert (", "do not compile"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_code_gold(bad)


def test_correct_solution_passes_and_wrong_one_fails(root):
    ok = grade_code(fenced(ADD), GOLD, timeout_s=5, tmp_root=str(root))
    assert ok.passed and ok.status == "passed" and ok.program == ADD
    assert ok.grade_fields() == {"correct": True, "extracted": ADD, "status": "ok"}
    wrong = grade_code(fenced(ADD.replace("+", "-")), GOLD, timeout_s=5, tmp_root=str(root))
    assert not wrong.passed and wrong.status == "failed" and "AssertionError" in wrong.stderr_tail
    plain = grade_code(
        ADD, "assert add(2, 2) == 4", timeout_s=5, tmp_root=str(root)
    )  # plain-assert gold
    assert plain.status == "passed"


def test_no_code_errors_and_entry_points(root):
    assert grade_code("<think>never closed", GOLD, tmp_root=str(root)).status == "no_code"
    assert (
        grade_code("I don't know.", GOLD, timeout_s=5, tmp_root=str(root)).status == "error"
    )  # not Python
    missing = grade_code(
        fenced("def plus(a, b):\n    return a + b\n"), GOLD, timeout_s=5, tmp_root=str(root)
    )
    assert missing.status == "error" and "entry point 'add' is not defined" in missing.stderr_tail
    crash = grade_code(
        fenced("raise RuntimeError('boom')\n"), GOLD, timeout_s=5, tmp_root=str(root)
    )
    assert crash.status == "error" and "boom" in crash.stderr_tail
    # HumanEval style: the tests' check(candidate) gets the entry point, not a check() of the
    # program's own.
    humaneval = json.dumps(
        {"entry_point": "add", "tests": "def check(candidate):\n    assert candidate(2, 3) == 5\n"}
    )
    program = ADD + "def check(x):\n    raise RuntimeError('not the tests')\n"
    assert (
        grade_code(fenced(program), humaneval, timeout_s=5, tmp_root=str(root)).status == "passed"
    )
    wrong = grade_code(fenced(ADD.replace("+", "*")), humaneval, timeout_s=5, tmp_root=str(root))
    assert wrong.status == "failed"


def test_exiting_early_is_not_a_pass(root):
    for exit_call in ("import os\nos._exit(0)\n", "import sys\nsys.exit(0)\n"):
        assert (
            run_program(
                ADD + exit_call, "assert add(1, 2) == 3", timeout_s=5, tmp_root=str(root)
            ).status
            == "error"
        )


def test_infinite_loop_is_killed_within_the_timeout(root):
    start = time.monotonic()
    result = grade_code(fenced("while True:\n    pass\n"), GOLD, timeout_s=1, tmp_root=str(root))
    assert result.status == "timeout" and not result.passed
    assert time.monotonic() - start < 2.0
    assert result.grade_fields()["status"] == "timeout"


SOLUTIONS = {
    "is_palindrome": "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n"
    "    return t == t[::-1]\n",
    "fizzbuzz": "def fizzbuzz(n):\n"
    "    return ['FizzBuzz' if k % 15 == 0 else 'Fizz' if k % 3 == 0 else 'Buzz' if k % 5 == 0"
    " else str(k) for k in range(1, n + 1)]\n",
    "count_vowels": "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)\n",
    "reverse_words": "def reverse_words(s):\n    return ' '.join(reversed(s.split()))\n",
    "second_largest": "def second_largest(nums):\n    v = sorted(set(nums))\n"
    "    return v[-2] if len(v) > 1 else None\n",
    "flatten": "def flatten(x):\n"
    "    return [z for y in x for z in (flatten(y) if isinstance(y, list) else [y])]\n",
    "is_prime": "def is_prime(n):\n"
    "    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n",
    "fibonacci": "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n"
    "        a, b = b, a + b\n    return a\n",
    "run_length_encode": "import itertools\ndef run_length_encode(s):\n"
    "    return ''.join(f'{k}{len(list(g))}' for k, g in itertools.groupby(s))\n",
    "merge_intervals": "def merge_intervals(iv):\n    out = []\n    for a, b in sorted(iv):\n"
    "        if out and a <= out[-1][1]:\n            out[-1][1] = max(out[-1][1], b)\n"
    "        else:\n            out.append([a, b])\n    return out\n",
    "word_frequencies": "import re\nfrom collections import Counter\ndef word_frequencies(text):\n"
    "    return dict(Counter(w.lower() for w in re.findall('[A-Za-z]+', text)))\n",
    "balanced_brackets": "def balanced_brackets(s):\n"
    "    pairs, stack = {')': '(', ']': '[', '}': '{'}, []\n"
    "    for c in s:\n        if c in '([{':\n            stack.append(c)\n"
    "        elif c in pairs and (not stack or stack.pop() != pairs[c]):\n"
    "            return False\n    return not stack\n",
}


def test_shipped_benchmark_is_well_formed_and_solvable(root):
    rows = read_jsonl(str(REPO / "config" / "benchmarks" / "tinycode.jsonl"))
    assert len(rows) == 12 and len({r["prompt_id"] for r in rows}) == 12
    for row in rows:
        assert set(row) == {"prompt_id", "prompt", "answer", "kind"} and row["kind"] == "code"
        _, entry = parse_code_gold(row["answer"])
        result = grade_code(
            fenced(SOLUTIONS[entry]), row["answer"], timeout_s=5, tmp_root=str(root)
        )
        assert result.status == "passed", (entry, result.stderr_tail)
        assert (
            grade_code(
                fenced(f"def {entry}(*a):\n    return None\n"),
                row["answer"],
                timeout_s=5,
                tmp_root=str(root),
            ).status
            == "failed"
        ), entry
