"""Coding eval: run the program from a response against a problem's tests in a sandboxed subprocess.

A problem's gold (its ``answer`` string, kind ``"code"``) is either plain Python ``assert`` statements, or
JSON ``{"tests": "<python>" or ["<line>", ...], "entry_point": "name"}``. With an entry point, the name must
be defined by the program, and tests that define HumanEval's ``check(candidate)`` get it called with it.

The program is the last ```python (or ```py) block of the text after the last ``</think>``, else the last
bare ``` block, else that whole text. It runs with the tests in ``python -I -S -B`` in a fresh temporary
directory (cwd, HOME and TMPDIR), with a minimal environment, stdin on /dev/null, a wall-clock timeout that
kills the whole process group, resource limits (CPU, address space, file size, processes, no core dumps)
and an audit hook that refuses writes, deletes, renames, links and mode changes outside that directory as
well as starting processes, signalling, ctypes and sockets (reading anywhere stays allowed). This guards against careless or runaway
programs, not a determined attacker (a C extension or some other path around the hook could escape it);
untrusted code at scale wants a container or VM around it as well. Limits are set by the child itself
before any model code runs, not in ``preexec_fn``, which is unsafe when the grader uses threads.
"""

from __future__ import annotations

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
import textwrap
import time
from dataclasses import dataclass
from typing import Any

TIMEOUT_S = 10.0
MEMORY_MB = 1024
FILE_SIZE_MB = 16
_TAIL = 4000  # bytes of stderr kept in a result

# Prelude and harness, run in the child. Placeholders are filled with repr()s of the values.
_HARNESS = r"""
import _posixsubprocess, os, resource, subprocess, sys, traceback, types
sys.dont_write_bytecode = True
_TOKEN = os.environ.pop("STILLROOM_TOKEN", "")
for _res, _lim in ((resource.RLIMIT_CPU, __CPU__), (resource.RLIMIT_AS, __MEMORY__),
                   (resource.RLIMIT_FSIZE, __FSIZE__), (resource.RLIMIT_NPROC, 0), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(_res, (_lim, _lim + 1 if _res == resource.RLIMIT_CPU else _lim))
_exit, _write, _readlink, _realpath = os._exit, os.write, os.readlink, os.path.realpath
_BOX = _realpath(os.getcwd())
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_DENY = ("subprocess.Popen", "os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
         "os.kill", "os.killpg", "signal.pthread_kill", "ctypes.dlopen", "ctypes.dlsym", "socket.connect",
         "socket.bind", "socket.sendto", "socket.sendmsg", "sys.remote_exec")
# event -> (index of a path argument, index of its dir_fd argument or None)
_PATHS = {"os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "os.chmod": ((0, 2),),
          "os.chown": ((0, 3),), "os.utime": ((0, 3),), "os.truncate": ((0, None),), "os.symlink": ((1, 2),),
          "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)), "os.setxattr": ((0, None),),
          "os.removexattr": ((0, None),), "os.chflags": ((0, None),), "shutil.rmtree": ((0, 1),)}

def _where(path, dir_fd=None):
    if isinstance(path, int):  # an open file descriptor: where it points
        return _readlink(f"/proc/self/fd/{path}")
    path = os.fsdecode(os.fspath(path))
    if dir_fd not in (None, -1) and not os.path.isabs(path):
        path = os.path.join(_readlink(f"/proc/self/fd/{dir_fd}"), path)
    return _realpath(path)  # symlinks resolved: a link in the box cannot point a write outside

def _inside(path):
    return path == _BOX or path.startswith(_BOX + os.sep)

def _hook(event, args):
    if event in _DENY or (event == "import" and args[0] == "_posixsubprocess"):
        raise PermissionError(f"sandbox: {event} {args[0] if event == 'import' else ''}".rstrip() + " is not allowed")
    if event == "open":
        path, mode, flags = args
        if path is None or isinstance(path, int):
            return
        where = _where(path)
        write = flags & _WRITE if isinstance(flags, int) else any(c in (mode or "") for c in "wax+")
        # Reading outside is fine (imports need it); a directory fd outside would allow dir_fd-relative writes.
        if not _inside(where) and (write or os.path.isdir(where)):
            raise PermissionError(f"sandbox: opening {where} for writing (or a directory) outside the sandbox "
                                  "is not allowed")
    for i, j in _PATHS.get(event, ()):
        where = _where(args[i], args[j] if j is not None else None)
        if not _inside(where):
            raise PermissionError(f"sandbox: {event} on {where} outside the sandbox is not allowed")

def _guarded(fn):  # os.mkfifo and os.mknod raise no audit event
    def wrapper(path, *a, dir_fd=None, **k):
        if not _inside(_where(path, dir_fd)):
            raise PermissionError(f"sandbox: {fn.__name__} outside the sandbox is not allowed")
        return fn(path, *a, dir_fd=dir_fd, **k)
    return wrapper

def _no_fork_exec(*args, **kwargs):
    raise PermissionError("sandbox: _posixsubprocess.fork_exec is not allowed")

# fork_exec raises no audit event (multiprocessing's spawn calls it directly); subprocess is imported
# first so that "import subprocess" still works, and importing a fresh _posixsubprocess is refused.
_posixsubprocess.fork_exec = _no_fork_exec
os.mkfifo, os.mknod = _guarded(os.mkfifo), _guarded(os.mknod)
sys.addaudithook(_hook)

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
        """Keyword arguments for grading.Grade; the run's own status is in ``status`` of this result."""
        status = {"no_code": "no_answer", "timeout": "timeout"}.get(self.status, "ok")
        return {"correct": self.passed, "extracted": self.program, "status": status}


def parse_code_gold(gold: str) -> tuple[str, str | None]:
    """(tests source, entry point or None); raises ValueError on a malformed gold (a benchmark bug)."""
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


_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[^\n]*\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)


def extract_program(response: str) -> str | None:
    # Imported here, not at the top: grading may import this module.
    from .grading import _answer_text

    text = _answer_text(response)
    if text is None:
        return None
    blocks = [(lang.lower(), textwrap.dedent(body)) for lang, body in _FENCE.findall(text)]
    for langs in (("python", "py", "python3"), ("",)):
        picked = [body for lang, body in blocks if lang in langs and body.strip()]
        if picked:
            return picked[-1]
    return text.strip() or None


def _tail(f: Any, limit: int = _TAIL) -> str:
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - limit))
    return f.read().decode("utf-8", "replace")


def _remove(box: str) -> None:
    # The program may have made directories unreadable; never chmod through a symlink out of the box.
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
    """Run ``program`` then ``tests`` in a sandboxed child; ``tmp_root`` holds its temporary directory."""
    box = tempfile.mkdtemp(prefix="stillroom-code-", dir=tmp_root)
    token = secrets.token_hex(
        16
    )  # printed by the harness after the tests: exit 0 alone proves nothing
    start = time.monotonic()
    try:
        values = {
            "CPU": math.ceil(timeout_s) + 1,
            "MEMORY": memory_mb << 20,
            "FSIZE": FILE_SIZE_MB << 20,
            "PROGRAM": program,
            "TESTS": tests,
            "ENTRY": entry_point,
        }
        # One pass, so a program that happens to contain "__TESTS__" is not substituted into.
        harness = re.sub(
            r"__(CPU|MEMORY|FSIZE|PROGRAM|TESTS|ENTRY)__", lambda m: repr(values[m[1]]), _HARNESS
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
