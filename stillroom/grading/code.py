"""Coding answers: the program of a response run against the problem's tests, sandboxed.

A problem's gold (its ``answer``, kind ``"code"``) is either plain Python ``assert`` statements, or
JSON ``{"tests": "<python>" or ["<line>", ...], "entry_point": "name"}``. With an entry point, the
name must be defined by the program, and tests that define HumanEval's ``check(candidate)`` get it
called with it.

Two processes (code_runner.py): the candidate runs the program (formats.extract_program) and then
answers calls of its top-level functions over a pair of pipes; the judge runs the tests with those
names bound to proxies, and its exit status alone is the verdict. The candidate never sees the tests
and cannot reach the judge: whatever it prints, patches or forges, it only chooses its own return
values, which cross as plain data. Each runs in ``python -I -S -B`` inside bubblewrap
(sandbox.bwrap: own PID, network and mount namespaces, a minimal read-only root with a private /tmp,
a cleared environment), the candidate with only its own fresh directory writable (cwd, HOME and
TMPDIR), under the sandbox's resource limits and audit hook; stdin is /dev/null. Each process may
spend ``TIMEOUT_S`` CPU seconds (RLIMIT_CPU: the same verdict on a busy machine); past it the run is
a ``"timeout"``. Wall time is only a far backstop (sandbox.backstop_s) that kills both: a run past
it that the machine starved is the machine's fault, graded ``"harness"``; one that blocked itself
(slept: sandbox.runnable_share) is a ``"timeout"``. Without bubblewrap
(sandbox.bwrap_available warns once, loudly) the same two processes run under the limits and the
audit hook alone.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from .. import sandbox
from .formats import extract_program
from .result import Grade, Options

TIMEOUT_S = 3.0  # CPU seconds of each process: under the grading worker's, so that it is reported
MEMORY_MB = 1024
FILE_SIZE_MB = 16
_TAIL = 4000  # bytes of stderr kept in a result

RUNNER = os.path.join(os.path.dirname(os.path.realpath(__file__)), "code_runner.py")
# where the sandbox binds it (stdlib only, under -I -S: a venv's interpreter or its base, alike)
PYTHON = os.path.realpath(sys.executable)
EXIT_PASSED, EXIT_FAILED = 0, 2  # the judge's exit statuses (code_runner.py); others: an error


@dataclass(frozen=True)
class CodeResult:
    passed: bool
    # "passed", "failed" (an assert failed), "timeout" (out of CPU time, or blocked itself past the
    # wall-clock backstop), "backstop" (starved past it: not the program's fault), "error" or
    # "no_code"
    status: str
    stderr_tail: str
    program: str | None
    duration_s: float = 0.0

    def grade_fields(self) -> dict[str, Any]:
        """Keyword arguments for grading.Grade; the run's own status is in ``status`` of this
        result."""
        status = {"no_code": "no_answer", "timeout": "timeout", "backstop": "harness"}.get(
            self.status, "ok"
        )
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


_LIBRARIES = {
    "purelib": "<site-packages>",
    "platlib": "<site-packages>",
    "stdlib": "<stdlib>",
    "platstdlib": "<stdlib>",
}


def _placeholders(box: str) -> list[tuple[str, str]]:
    """(path, placeholder) pairs for ``portable``, longest path first: the run's temporary
    directory, this package's directory (the checkout's or an installation's), the interpreter and
    its library directories."""
    package = os.path.dirname(os.path.dirname(RUNNER))
    pairs = {box: "<box>", os.path.realpath(box): "<box>", package: "<stillroom>"}
    pairs[PYTHON] = "<python>"
    paths = sysconfig.get_paths()
    for key, name in _LIBRARIES.items():
        if paths.get(key):
            pairs.setdefault(paths[key], name)
            pairs.setdefault(os.path.realpath(paths[key]), name)
    return sorted(pairs.items(), key=lambda kv: len(kv[0]), reverse=True)


def portable(text: str, box: str) -> str:
    """``text`` (a run's stderr) with the paths of this machine and checkout replaced by stable
    placeholders: a result is an artifact, and its bytes must not depend on where the repository,
    the interpreter or the temporary directory are (a traceback names the runner's file, a
    refused write the candidate's directory). What is inside the box keeps its path below it:
    ``<box>/candidate/out.txt``."""
    for path, placeholder in _placeholders(box):
        if path and path != os.sep:
            text = text.replace(path, placeholder)
    return text


def _remove(box: str) -> None:
    # The program may have made directories unreadable; never chmod through a symlink out of the
    # box.
    for root, dirs, _ in os.walk(box):
        for d in dirs:
            path = os.path.join(root, d)
            if not os.path.islink(path):
                os.chmod(path, 0o700)
    shutil.rmtree(box, ignore_errors=True)


def _start(role: str, work: str, fds: tuple[int, int], **streams: Any) -> subprocess.Popen:
    """One side of a run, talking over ``fds`` (in, out) and reading its spec from stdin. The
    candidate works in ``work``, the one directory it may write; the judge writes nowhere, and
    under bubblewrap sees no directory of the host's but the interpreter and its own code."""
    argv = [PYTHON, "-I", "-S", "-B", RUNNER, role, sandbox.__file__]
    argv += [str(fd) for fd in fds]
    candidate = role == "candidate"
    boxed = sandbox.bwrap_available()
    if boxed and not candidate:
        work = "/tmp"  # its private one
    env = {"PATH": os.defpath, "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8"}
    if boxed:
        argv = sandbox.bwrap(
            argv,
            cwd=work,
            writable=[work] if candidate else [],
            env=env,
            readable=[RUNNER, sandbox.__file__],
        )
    return subprocess.Popen(
        argv,
        cwd=None if boxed else work,
        env=None if boxed else env,  # bwrap is started with an empty one and sets env inside
        stdin=subprocess.PIPE,
        pass_fds=fds,
        start_new_session=True,
        **streams,
    )


def _send_spec(proc: subprocess.Popen, spec: dict) -> None:
    """The spec on the process's stdin, which then stays at its end (a program reading stdin
    reads nothing)."""
    try:
        proc.stdin.write(json.dumps(spec).encode())
        proc.stdin.close()
    except BrokenPipeError:  # it died before reading: its exit status tells
        pass


def _kill(proc: subprocess.Popen) -> int:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group: anything it started goes too
    except ProcessLookupError:
        pass
    return proc.wait()


def run_program(
    program: str,
    tests: str,
    entry_point: str | None = None,
    *,
    timeout_s: float = TIMEOUT_S,
    memory_mb: int = MEMORY_MB,
    tmp_root: str | None = None,
) -> CodeResult:
    """Run ``program`` in a sandboxed candidate process and ``tests`` in a sandboxed judge process
    calling it, each under ``timeout_s`` CPU seconds; ``tmp_root`` holds their temporary
    directory."""
    box = tempfile.mkdtemp(prefix="stillroom-code-", dir=tmp_root)
    start = time.monotonic()
    deadline = start + sandbox.backstop_s(timeout_s)

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    limits = {
        "cpu_s": math.ceil(timeout_s),
        "memory_bytes": memory_mb << 20,
        "file_bytes": FILE_SIZE_MB << 20,
    }
    # the candidate's own directory, and the judge's working directory without bubblewrap
    work = {side: os.path.join(box, side) for side in ("candidate", "judge")}
    for path in work.values():
        os.mkdir(path)
    to_candidate, to_judge = os.pipe(), os.pipe()  # (read end, write end) each
    procs: list[subprocess.Popen] = []
    try:
        with (
            open(os.path.join(box, "candidate.out"), "w+b") as out,
            open(os.path.join(box, "candidate.err"), "w+b") as err,
            open(os.path.join(box, "judge.err"), "w+b") as judge_err,
        ):
            judge = _start(
                "judge",
                work["judge"],
                (to_judge[0], to_candidate[1]),
                stdout=subprocess.DEVNULL,
                stderr=judge_err,
            )
            procs.append(judge)
            candidate = _start(
                "candidate",
                work["candidate"],
                (to_candidate[0], to_judge[1]),
                stdout=out,
                stderr=err,
            )
            procs.append(candidate)
            for fd in (*to_candidate, *to_judge):  # theirs now: an exit is seen as an end of file
                os.close(fd)
            to_candidate = to_judge = ()
            _send_spec(judge, {"tests": tests, "entry_point": entry_point, **limits})
            _send_spec(candidate, {"program": program, **limits})
            runnable = None
            try:
                judge_rc, timed_out = judge.wait(timeout=left()), False
            except subprocess.TimeoutExpired:
                runnable = sandbox.runnable_share([judge.pid, candidate.pid])
                judge_rc, timed_out = _kill(judge), True
            # The verdict is in; a candidate still running is killed (it ends on its own at the
            # judge's end of file, but need not).
            try:
                candidate_rc = candidate.wait(timeout=min(0.5, left()))
            except subprocess.TimeoutExpired:
                candidate_rc = _kill(candidate)
            procs.clear()
            stderr = portable(_tail(err) + _tail(judge_err), box)[-_TAIL:]
    finally:
        for proc in procs:
            _kill(proc)
        for fd in (*to_candidate, *to_judge):
            os.close(fd)
        _remove(box)
    if sandbox.out_of_cpu(judge_rc) or sandbox.out_of_cpu(candidate_rc):
        status = "timeout"
    elif timed_out and sandbox.blocked(runnable):  # the program slept: its own fault
        status = "timeout"
    elif timed_out:
        status = "backstop"
    elif judge_rc == EXIT_PASSED:
        status = "passed"
    else:
        status = "failed" if judge_rc == EXIT_FAILED else "error"
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
        "options": {
            "sandbox_cpu_s": TIMEOUT_S,
            "sandbox_backstop_s": sandbox.backstop_s(TIMEOUT_S),
            "python": "-I -S -B, audit hook, tests in a separate judge process",
            "bwrap": sandbox.bwrap_available(),
        },
    }
