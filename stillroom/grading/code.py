"""Coding answers: the program of a response run against the problem's tests, sandboxed.

A problem's gold (its ``answer``, kind ``"code"``) is either plain Python ``assert`` statements, or
JSON ``{"tests": "<python>" or ["<line>", ...], "entry_point": "name"}``. With an entry point, the
name must be defined by the program, and tests that define HumanEval's ``check(candidate)`` get it
called with it.

The program (formats.extract_program) runs with the tests in ``python -I -S -B`` in a fresh
temporary directory (cwd, HOME and TMPDIR), with a minimal environment, stdin on /dev/null, a
wall-clock timeout that kills the whole process group, and the sandbox (sandbox.py: CPU, memory,
file size and process limits, and an audit hook confining writes to that directory).
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from .. import sandbox
from .formats import extract_program
from .result import Grade, Options

TIMEOUT_S = 3.0  # the sandbox's own limit: under the grading worker's, so that it is reported
MEMORY_MB = 1024
FILE_SIZE_MB = 16
_TAIL = 4000  # bytes of stderr kept in a result

# The child's script. It sets up the sandbox (sandbox.py, loaded from its file: under -I -S nothing
# else can be imported) before any model code runs. Placeholders are filled with repr()s of
# values.
_HARNESS = r"""
import importlib.util, os, sys, traceback, types
sys.dont_write_bytecode = True
_TOKEN = os.environ.pop("STILLROOM_TOKEN", "")
_spec = importlib.util.spec_from_file_location("stillroom_sandbox", __SANDBOX__)
_sandbox = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_sandbox)
_sandbox.limit(cpu_s=__CPU__, memory_bytes=__MEMORY__, file_bytes=__FSIZE__, processes=0)
_exit, _write = os._exit, os.write
_sandbox.guard(box=os.getcwd())

def _fail(code):
    traceback.print_exc()
    sys.stderr.flush()
    _exit(code)

_ENTRY = __ENTRY__
_mod = types.ModuleType("solution")  # not __main__: demo blocks reading stdin stay off
sys.modules["solution"] = _mod
try:
    exec(compile(__PROGRAM__, "solution.py", "exec"), _mod.__dict__)
except BaseException:
    _fail(3)  # a program that does not run at all is an error, not a failed test
_tests = dict(_mod.__dict__)
_tests.pop("check", None)
try:
    if _ENTRY is not None and not callable(_tests.get(_ENTRY)):
        raise NameError(f"entry point {_ENTRY!r} is not defined by the program")
    exec(compile(__TESTS__, "tests.py", "exec"), _tests)
    if _ENTRY is not None and callable(_tests.get("check")):
        _tests["check"](_tests[_ENTRY])
except AssertionError:
    _fail(2)
except BaseException:
    _fail(3)
try:
    sys.stdout.flush()
except BaseException:
    pass
_write(1, ("\n" + _TOKEN + "\n").encode())  # written last: only a run that got here can have passed
_exit(0)
"""


@dataclass(frozen=True)
class CodeResult:
    passed: bool
    status: str  # "passed", "failed" (an assert failed), "timeout", "error" or "no_code"
    stderr_tail: str
    program: str | None
    duration_s: float = 0.0

    def grade_fields(self) -> dict[str, Any]:
        """Keyword arguments for grading.Grade; the run's own status is in ``status`` of this
        result."""
        status = {"no_code": "no_answer", "timeout": "timeout"}.get(self.status, "ok")
        return {"correct": self.passed, "extracted": self.program, "status": status}


def parse_code_gold(gold: str) -> tuple[str, str | None]:
    """(tests source, entry point or None); raises ValueError on a malformed gold (a benchmark
    bug)."""
    tests, entry = gold, None
    if gold.lstrip().startswith("{"):
        try:
            spec = json.loads(gold)
        except ValueError as e:
            raise ValueError(f"code gold is not valid JSON: {e}") from None
        if not isinstance(spec, dict) or set(spec) - {"tests", "entry_point"}:
            raise ValueError(
                f"code gold must have keys 'tests' and optionally 'entry_point', got {spec!r}"
            )
        tests, entry = spec.get("tests"), spec.get("entry_point")
        if isinstance(tests, list) and all(isinstance(t, str) for t in tests):
            tests = "\n".join(tests)
        if entry is not None and not (isinstance(entry, str) and entry.isidentifier()):
            raise ValueError(f"code gold entry_point must be an identifier, got {entry!r}")
    if not isinstance(tests, str) or not tests.strip():
        raise ValueError(f"code gold has no tests: {gold!r}")
    try:
        compile(tests, "tests.py", "exec")
    except SyntaxError as e:
        raise ValueError(f"code gold tests do not compile: {e}") from None
    return tests, entry


def _tail(f: Any, limit: int = _TAIL) -> str:
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - limit))
    return f.read().decode("utf-8", "replace")


def _remove(box: str) -> None:
    # The program may have made directories unreadable; never chmod through a symlink out of the
    # box.
    for root, dirs, _ in os.walk(box):
        for d in dirs:
            path = os.path.join(root, d)
            if not os.path.islink(path):
                os.chmod(path, 0o700)
    shutil.rmtree(box, ignore_errors=True)


def run_program(
    program: str,
    tests: str,
    entry_point: str | None = None,
    *,
    timeout_s: float = TIMEOUT_S,
    memory_mb: int = MEMORY_MB,
    tmp_root: str | None = None,
) -> CodeResult:
    """Run ``program`` then ``tests`` in a sandboxed child; ``tmp_root`` holds its temporary
    directory."""
    box = tempfile.mkdtemp(prefix="stillroom-code-", dir=tmp_root)
    # printed by the harness after the tests: exit 0 alone proves nothing
    token = secrets.token_hex(16)
    start = time.monotonic()
    try:
        values = {
            "SANDBOX": sandbox.__file__,
            "CPU": math.ceil(timeout_s) + 1,
            "MEMORY": memory_mb << 20,
            "FSIZE": FILE_SIZE_MB << 20,
            "PROGRAM": program,
            "TESTS": tests,
            "ENTRY": entry_point,
        }
        # One pass, so a program that happens to contain "__TESTS__" is not substituted into.
        harness = re.sub(
            r"__(SANDBOX|CPU|MEMORY|FSIZE|PROGRAM|TESTS|ENTRY)__",
            lambda m: repr(values[m[1]]),
            _HARNESS,
        )
        with open(os.path.join(box, "_run.py"), "w") as f:
            f.write(harness)
        env = {
            "PATH": os.defpath,
            "HOME": box,
            "TMPDIR": box,
            "LANG": "C.UTF-8",
            "STILLROOM_TOKEN": token,
        }
        with (
            open(os.path.join(box, "_stdout"), "w+b") as out,
            open(os.path.join(box, "_stderr"), "w+b") as err,
        ):
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", "_run.py"],
                cwd=box,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
            try:
                rc, timed_out = proc.wait(timeout=timeout_s), False
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # the group: anything it started goes too
                except ProcessLookupError:
                    pass
                rc, timed_out = proc.wait(), True
            stdout, stderr = _tail(out, 200), _tail(err)
    finally:
        _remove(box)
    if timed_out or rc == -signal.SIGXCPU:
        status = "timeout"
    elif rc == 0 and stdout.rstrip().endswith(token):
        status = "passed"
    else:
        status = "failed" if rc == 2 else "error"
    return CodeResult(
        status == "passed", status, stderr, program, round(time.monotonic() - start, 3)
    )


def grade_code(
    response: str,
    gold: str,
    timeout_s: float = TIMEOUT_S,
    *,
    memory_mb: int = MEMORY_MB,
    tmp_root: str | None = None,
) -> CodeResult:
    tests, entry = parse_code_gold(gold)
    program = extract_program(response)
    if program is None:
        return CodeResult(False, "no_code", "", None)
    return run_program(
        program, tests, entry, timeout_s=timeout_s, memory_mb=memory_mb, tmp_root=tmp_root
    )


def grade(response: str, gold: str, options: Options) -> Grade:
    result = grade_code(response, gold, timeout_s=TIMEOUT_S)
    details = {
        "run": result.status,
        "seconds": round(result.duration_s, 3),
        "stderr_tail": result.stderr_tail[-500:],
    }
    return Grade(**result.grade_fields(), details=details)


def item_limit(options: Options) -> float:
    """The grading worker waits this long: the sandbox reports its own timeout first."""
    return TIMEOUT_S + 3


def info(options: Options) -> dict[str, Any]:
    return {
        "name": "code-sandbox",
        "version": importlib.metadata.version("stillroom"),
        "options": {"sandbox_timeout_s": TIMEOUT_S, "python": "-I -S -B, audit hook"},
    }
