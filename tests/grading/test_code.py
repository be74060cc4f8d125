"""The code grader: gold formats, pass/fail, entry points, timeouts and clean-up; the data that
crosses between candidate and judge; candidates forging the verdict; running without bubblewrap."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from stillroom import sandbox
from stillroom.grading.code import grade_code, parse_code_gold, run_program
from stillroom.grading.code_runner import decode, encode
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
    # judged by its CPU seconds: the wall clock only has to stay under the far backstop
    assert time.monotonic() - start < sandbox.backstop_s(1)


@pytest.mark.slow
def test_a_program_that_sleeps_past_the_backstop_is_a_timeout_not_a_harness_fault(root):
    # it spends no CPU, so only the wall-clock backstop ends it; having blocked itself (it never
    # ran nor waited for a CPU) it is the program's fault, as a spin out of CPU time is
    result = run_program(
        "import time\ntime.sleep(1000)\n", "assert True", timeout_s=0.5, tmp_root=str(root)
    )
    assert result.status == "timeout" and not result.passed, result
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


def test_wire_format_round_trips_plain_data_and_refuses_the_rest():
    values = [
        None,
        True,
        -3,
        10**40,
        2.5,
        float("inf"),
        -float("inf"),
        complex(1, -2),
        "naïve",
        b"\x00\xff",
        bytearray(b"ab"),
        [1, [2, (3, "x")]],
        (),
        {1, 2},
        frozenset({(1, 2)}),
        {(1, 2): {"a": [None]}, 3: 4.0, frozenset(): b""},
        range(1, 10, 3),
    ]
    for value in values:
        back = decode(json.loads(json.dumps(encode(value), allow_nan=False)))
        assert back == value and type(back) is type(value), value
    nan = decode(encode(float("nan")))
    assert nan != nan
    assert list(decode(encode(x * x for x in range(3)))) == [0, 1, 4]  # an iterator, as sent
    # subclasses cross as their built-in base: an __eq__ of the candidate's never does
    Always = type("Always", (int,), {"__eq__": lambda self, other: True, "__hash__": int.__hash__})
    assert type(decode(encode(Always(7)))) is int and decode(encode(Always(7))) != 8
    for bad in [object(), print, type, ..., Always.__eq__]:
        with pytest.raises(TypeError, match="not plain data"):
            encode(bad)
    for bad in [
        {"pickle": "x"},
        {"tuple": 1},
        {"float": "1e999"},
        {"a": 1, "b": 2},
        {"dict": [[1]]},
    ]:
        with pytest.raises(ValueError):
            decode(bad)
    with pytest.raises(TypeError):  # an unhashable key
        decode({"dict": [[[1], 2]]})


HUMANEVAL_STYLE = json.dumps(
    {
        "entry_point": "parse",
        "tests": "import math\n"
        "def check(candidate):\n"
        "    assert candidate('1 2') == (1, 2)\n"
        "    assert candidate('1 2', as_set=True) == {1, 2}\n"
        "    assert list(candidate('3 4', lazy=True)) == [3, 4]\n"
        "    assert math.isclose(half(3), 1.5)\n"
        "    try:\n"
        "        candidate('x')\n"
        "    except ValueError as e:\n"
        "        assert 'bad token' in str(e)\n"
        "    else:\n"
        "        raise AssertionError('no error')\n",
    }
)
PARSE = (
    "import math\n"
    "class BadToken(ValueError):\n    pass\n"
    "def half(x):\n    return x / 2\n"
    "def sort_in_place(xs, seen):\n    xs.sort()\n    seen['sorted'] = True\n"
    "def parse(s, as_set=False, lazy=False):\n"
    "    if not s[0].isdigit():\n        raise BadToken('bad token ' + s)\n"
    "    items = (int(t) for t in s.split())\n"
    "    return items if lazy else set(items) if as_set else tuple(items)\n"
)


def test_calls_cross_with_their_types_keywords_and_exceptions(root):
    """The tests see what they would see in-process: tuples stay tuples, sets sets, a generator
    is iterable, a raised ValueError subclass is caught as a ValueError, a list sorted in place is
    sorted; modules the program imported are there for the tests; a list where a tuple is
    expected fails."""
    result = grade_code(fenced(PARSE), HUMANEVAL_STYLE, timeout_s=5, tmp_root=str(root))
    assert result.status == "passed", result.stderr_tail
    as_list = PARSE.replace("else tuple(items)", "else list(items)")
    result = grade_code(fenced(as_list), HUMANEVAL_STYLE, timeout_s=5, tmp_root=str(root))
    assert result.status == "failed"
    mbpp_style = (
        "assert parse('5 6') == (5, 6)\nassert math.isclose(half(1), 0.5)\n"
        "xs, seen = [3, 1, 2], {}\nassert sort_in_place(xs, seen) is None\n"
        "assert xs == [1, 2, 3] and seen == {'sorted': True}\n"
    )
    assert grade_code(fenced(PARSE), mbpp_style, timeout_s=5, tmp_root=str(root)).passed


# Candidates that try to forge the verdict instead of computing the answer. Each must earn
# "failed" or "error": the tests and the verdict are in the judge's process.
FORGERIES = {
    # the old scheme: a pass token printed last, read from the initial environment
    "token": "import os, sys\n"
    "env = open('/proc/self/environ', 'rb').read().split(b'\\0')\n"
    "for v in env:\n    print(v.decode(errors='replace').split('=')[-1])\n"
    "print('passed')\nsys.stdout.flush()\n"
    "def add(a, b):\n    return 0\n",
    "exit before the tests": "import os\ndef add(a, b):\n    return 0\nos._exit(0)\n",
    "patched builtins": "import builtins\n"
    "builtins.AssertionError = type('Never', (Exception,), {})\n"
    "builtins.__dict__['assert'] = None\n"
    "def add(a, b):\n    return 0\n",
    "always equal": "class Any:\n    def __eq__(self, other):\n        return True\n"
    "def add(a, b):\n    return Any()\n",
    "always equal int": "class Any(int):\n    def __eq__(self, other):\n        return True\n"
    "    __hash__ = int.__hash__\n"
    "def add(a, b):\n    return Any(0)\n",
    # the candidate's own harness (code_runner.py runs as __main__) made to answer anything
    "patched harness": "import sys\nmain = sys.modules['__main__']\n"
    "main.encode = lambda value: True\n"
    'forged = b\'{"verdict": "passed"}\\n\'\n'
    "main.Channel.send = lambda self, message: main.os.write(self.out_fd, forged)\n"
    "def add(a, b):\n    return 0\n",
    # a greeting of its own on the judge's pipe, then gone
    "forged greeting": "import os, sys\n"
    "out = int(sys.argv[-1])\n"
    'os.write(out, b\'{"callables": [], "modules": []}\\n{"return": 3}\\n\')\n'
    "os._exit(0)\n",
    # looking for the tests to answer from them: they are never in this process or its files
    "read the tests": "import gc, glob, os\n"
    "seen = [o for o in gc.get_objects() if isinstance(o, str) and 'MARKER' in o]\n"
    "for path in glob.glob('../**', recursive=True) + glob.glob('/proc/*/cmdline'):\n"
    "    try:\n        seen.append(open(path).read(10000))\n    except Exception:\n        pass\n"
    "ANSWER = 3 if any('== 3' in s for s in seen) else 0\n"
    "def add(a, b):\n    return ANSWER\n",
}


@pytest.mark.parametrize("name", FORGERIES)
def test_forging_the_verdict_never_passes(root, name):
    tests = "assert add(1, 2) == 3  # MARKER\nassert add(2, 2) == 4\n"
    result = run_program(FORGERIES[name], tests, "add", timeout_s=5, tmp_root=str(root))
    assert result.status in ("failed", "error"), (name, result.status, result.stderr_tail)


def test_without_bubblewrap_one_loud_warning_and_the_same_verdicts(root, monkeypatch, capsys):
    monkeypatch.setattr(sandbox, "_BWRAP_OK", {})
    monkeypatch.setattr(sandbox, "_BWRAP_WARNED", [])
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "bwrap" else which(name))
    with pytest.warns(RuntimeWarning, match="NO OS SANDBOX: bwrap is not installed"):
        assert not sandbox.bwrap_available()
    assert "WARNING: NO OS SANDBOX" in capsys.readouterr().err
    started = []
    popen = subprocess.Popen

    def spy(argv, **kwargs):
        started.append(argv[0])
        return popen(argv, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # warned once, never again
        assert grade_code(fenced(ADD), GOLD, timeout_s=5, tmp_root=str(root)).status == "passed"
        wrong = fenced(ADD.replace("+", "-"))
        assert grade_code(wrong, GOLD, timeout_s=5, tmp_root=str(root)).status == "failed"
    assert started == [os.path.realpath(sys.executable)] * 4  # no bwrap in front
    assert capsys.readouterr().err == ""


def test_a_recorded_stderr_tail_names_no_path_of_this_machine(tmp_path):
    """A result is an artifact: its stderr_tail is the same in two checkouts and two temporary
    directories (a traceback names the runner's file, the program its own directory, a
    standard-library frame the interpreter's), with those paths as placeholders."""
    program = (
        "import json, os, sys\n"
        "print('in', os.getcwd(), os.path.abspath('out.txt'), file=sys.stderr)\n"
        "def add(a, b):\n"
        "    return json.loads('not json')\n"
    )
    tails = []
    for where in ("one", "two/deeper/than/the/first"):
        root = tmp_path / where
        root.mkdir(parents=True)
        result = run_program(program, "assert add(1, 2) == 3", "add", timeout_s=5, tmp_root=root)
        assert result.status == "error"
        tails.append(result.stderr_tail)
    assert tails[0] == tails[1]
    tail = tails[0]
    for local in (str(tmp_path), str(REPO), sys.prefix, os.path.realpath(sys.prefix)):
        assert local not in tail
    # still a useful tail: where it ran, the frames and the error
    assert "in <box>/candidate <box>/candidate/out.txt" in tail
    assert 'File "<stillroom>/grading/code_runner.py"' in tail
    assert 'File "<stdlib>/json/' in tail and "JSONDecodeError: Expecting value" in tail
