"""The one sandbox for untrusted code, as the code grader runs programs under it: writes outside its
directory, starting processes, memory and output are refused or limited; writes inside are fine; a
candidate that gets past the audit hook still reaches nothing of the host's under bubblewrap."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stillroom.grading.code import grade_code
from stillroom.sandbox import bwrap_available

from .conftest import REPO
from .grading.test_code import ADD, GOLD, fenced


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """Where sandboxes are made; every test checks it is left empty (no leftover temporary
    directories)."""
    sandboxes = tmp_path / "sandboxes"
    sandboxes.mkdir()
    yield sandboxes
    assert list(sandboxes.iterdir()) == []


def test_writes_outside_the_sandbox_are_blocked(root):
    outside = Path("/tmp") / f"escape-{uuid.uuid4().hex}"
    for target in (str(outside), "../escape", "../../escape"):
        program = f"with open({target!r}, 'w') as f:\n    f.write('x')\n" + ADD
        result = grade_code(fenced(program), GOLD, timeout_s=5, tmp_root=str(root))
        assert result.status == "error" and "PermissionError: sandbox" in result.stderr_tail
    # Swallowing the error does not help: the file is still never written.
    program = f"try:\n    open({str(outside)!r}, 'w')\nexcept OSError:\n    pass\n" + ADD
    assert grade_code(fenced(program), GOLD, timeout_s=5, tmp_root=str(root)).status == "passed"
    others = [
        "import os\nos.symlink('/tmp', 'link')\nopen('link/escape-{0}', 'w')\n",
        "import os\nos.remove({1!r})\n",
        "import os\nos.mkdir('../made')\n",
        "import os\nos.chdir('..')\nopen('escape', 'w')\n",
        "import shutil\nshutil.rmtree({2!r})\n",
        "import os\nos.rename('_run.py', '../moved')\n",
        "import os\nfd = os.open('/tmp', os.O_RDONLY)\n",
    ]
    keep = root.parent / "keep.txt"
    keep.write_text("keep")
    for other in others:
        program = other.format(outside.name, str(keep), str(root.parent)) + ADD
        result = grade_code(fenced(program), GOLD, timeout_s=5, tmp_root=str(root))
        assert result.status == "error" and "sandbox" in result.stderr_tail, other
    assert not outside.exists() and keep.read_text() == "keep"
    assert sorted(p.name for p in root.parent.iterdir()) == ["keep.txt", "sandboxes"]


def test_a_mkdir_of_a_directory_that_exists_is_let_through(root):
    """Libraries make their cache directories with makedirs(exist_ok=True) on every use (torch's
    Inductor, reached by importing torch._dynamo): a mkdir of a directory that exists changes
    nothing, so it raises FileExistsError, not the sandbox's refusal; a new one is still refused."""
    program = (
        "import os\n"
        "os.makedirs('/usr', exist_ok=True)\n"
        "try:\n    os.mkdir('/usr')\nexcept FileExistsError:\n    pass\n"
        "try:\n    os.makedirs('/usr/stillroom-new', exist_ok=True)\n"
        "except PermissionError as exc:\n    assert 'sandbox' in str(exc)\n"
        "else:\n    raise SystemExit('a new directory outside the box was made')\n"
    ) + ADD
    result = grade_code(fenced(program), GOLD, timeout_s=5, tmp_root=str(root))
    assert result.status == "passed", result.stderr_tail
    assert not Path("/usr/stillroom-new").exists()


def test_writes_inside_the_sandbox_are_allowed(root):
    program = (
        "import os, shutil, tempfile\nos.mkdir('d')\n"
        "with open('d/x.txt', 'w') as f:\n    f.write('hi')\n"
        "os.rename('d/x.txt', 'd/y.txt')\nshutil.rmtree('d')\ntempfile.mkstemp()\n"
        "open(os.path.expanduser('~/notes'), 'w').close()\n"
    ) + ADD
    assert grade_code(fenced(program), GOLD, timeout_s=5, tmp_root=str(root)).status == "passed"


@pytest.mark.parametrize(
    "program",
    [
        "import subprocess\nsubprocess.run(['touch', {marker!r}])\n",
        "import os\nos.system('touch {marker}')\n",
        "import os\nif os.fork() == 0:\n    open({marker!r}, 'w')\n",
        "import os\nos.execv('/bin/touch', ['touch', {marker!r}])\n",
        "import _posixsubprocess\n_posixsubprocess.fork_exec()\n",
        "import subprocess\nsubprocess._fork_exec()\n",  # its own reference to fork_exec
        "import multiprocessing as mp\nmp.get_context('spawn').Process(target=print).start()\n",
        "import ctypes\n",
    ],
)
def test_starting_processes_is_blocked(root, program):
    marker = root.parent / "spawned"
    result = grade_code(
        fenced(program.format(marker=str(marker)) + ADD), GOLD, timeout_s=5, tmp_root=str(root)
    )
    assert result.status == "error" and "PermissionError: sandbox" in result.stderr_tail
    assert not marker.exists()


def test_memory_and_output_are_limited(root):
    assert (
        grade_code(
            fenced("x = bytearray(4 << 30)\n" + ADD), GOLD, timeout_s=5, tmp_root=str(root)
        ).status
        == "error"
    )
    flood = grade_code(
        fenced("while True:\n    print('x' * 4096)\n"), GOLD, timeout_s=5, tmp_root=str(root)
    )
    assert flood.status == "error" and "File too large" in flood.stderr_tail


# A determined candidate gets around the audit hook (any in-process object is reachable: here the
# hook's own reference to the real fork_exec, and a `sys` whose audit() does nothing), then runs
# a fresh Python without the hook. Only the OS sandbox stands between it and the host.
UNHOOKED = r"""
import subprocess, sys, types, _posixsubprocess


def shell(code):
    cells = [c.cell_contents for c in _posixsubprocess.fork_exec.__closure__]
    subprocess._fork_exec = next(c for c in cells if getattr(c, "__name__", "") == "fork_exec")

    class Sys(types.ModuleType):
        def __getattr__(self, name):
            return getattr(sys, name)

        def audit(self, *args):
            pass

    subprocess.sys = Sys("sys")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return run.stdout + run.stderr
"""

ATTACKS = r"""
import glob, os, resource, socket, sqlite3
out = []
def attempt(name, f):
    try:
        f()
        out.append(name + ": done")
    except BaseException as e:
        out.append(name + ": " + type(e).__name__)
def environs():
    for path in glob.glob("/proc/*/environ"):
        try:
            out.extend(v for v in open(path).read().split("\0") if v.startswith("STILLROOM_T"))
        except OSError:
            pass
attempt("environ", environs)
attempt("home", lambda: out.append(open({home_secret!r}).read()))
attempt("repo", lambda: out.append(open({repo_file!r}).read()))
attempt("judge", lambda: out.append("judges seen: %d" % sum(
    b"judge" in open(p, "rb").read().split(b"\0") for p in glob.glob("/proc/[0-9]*/cmdline"))))
def connect():
    s = socket.create_connection(("127.0.0.1", {port}), timeout=1)
    s.sendall(b"escaped")
attempt("connect", connect)
attempt("raise fsize", lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (-1, -1)))
attempt("create", lambda: os.close(os.open({outside!r} + "/created", os.O_CREAT | os.O_WRONLY)))
attempt("tmp", lambda: open({tmp_file!r}, "w").write("x"))
attempt("mkdir", lambda: os.mkdir({outside!r} + "/made"))
attempt("symlink", lambda: os.symlink("/", {outside!r} + "/link"))
attempt("chmod", lambda: os.chmod({keep!r}, 0o777))
attempt("sqlite", lambda: sqlite3.connect({outside!r} + "/db.sqlite").execute("create table t (x)"))
print("\n".join(out))
"""

# The grader in a process of its own: /proc/PID/environ shows a process's initial environment,
# which is where a grader's secrets (API keys) would be.
GRADER = """
import json, sys
from stillroom.grading.code import run_program
r = run_program(sys.stdin.read(), "assert add(1, 2) == 3", timeout_s=10, tmp_root=sys.argv[1])
print(json.dumps([r.status, r.stderr_tail]))
"""


@pytest.mark.skipif(not bwrap_available(), reason="bubblewrap cannot run here")
def test_a_candidate_past_the_audit_hook_stays_in_its_sandbox(root, tmp_path):
    secret = f"STILLROOM_TEST_SECRET={uuid.uuid4().hex}"
    home, outside = tmp_path / "home", tmp_path / "outside"
    home.mkdir()
    outside.mkdir()
    (home / ".token").write_text(secret)
    keep = tmp_path / "keep.txt"
    keep.write_text("keep")
    keep.chmod(0o644)
    tmp_file = Path("/tmp") / f"escape-{uuid.uuid4().hex}"
    repo_file = REPO / "config" / "benchmarks" / "tinycode.jsonl"
    listener = socket.create_server(("127.0.0.1", 0))
    attacks = ATTACKS.format(
        home_secret=str(home / ".token"),
        repo_file=str(repo_file),
        port=listener.getsockname()[1],
        outside=str(outside),
        tmp_file=str(tmp_file),
        keep=str(keep),
    )
    program = UNHOOKED + f"print(shell({attacks!r}), file=sys.stderr)\n" + ADD
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "PYTHONPATH": str(REPO),
        "STILLROOM_TEST_SECRET": secret.split("=")[1],
    }
    run = subprocess.run(
        [sys.executable, "-c", GRADER, str(root)],
        input=program,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    status, stderr = json.loads(run.stdout)
    # the attacks ran (the program passed its test), and got nothing out
    assert status == "passed" and "connect: " in stderr and "sqlite: " in stderr, stderr
    assert secret.split("=")[1] not in stderr + run.stdout + run.stderr
    assert "judges seen: 0" in stderr
    assert json.loads(repo_file.read_text().splitlines()[0])["prompt"] not in stderr
    listener.settimeout(0.2)
    with pytest.raises(TimeoutError):
        listener.accept()
    listener.close()
    assert list(outside.iterdir()) == [] and not tmp_file.exists()
    assert keep.stat().st_mode & 0o777 == 0o644 and keep.read_text() == "keep"


def test_the_audit_hook_refuses_what_got_past_it(root, tmp_path):
    """The escapes outside testers found in the hook alone (without bubblewrap they are all
    there is): subprocess's own fork_exec, raising a limit to write more, SQLite's C writes."""
    outside = tmp_path / "outside"
    outside.mkdir()
    for attack in [
        "import subprocess\nsubprocess._fork_exec()\n",
        "import resource\nresource.setrlimit(resource.RLIMIT_FSIZE, (-1, -1))\n",
        "import resource\nresource.prlimit(0, resource.RLIMIT_CPU, (-1, -1))\n",
        f"import sqlite3\nsqlite3.connect({str(outside / 'db')!r})\n",
        f"import sqlite3\nsqlite3.connect('file:{outside}/db?mode=rwc', uri=True)\n",
    ]:
        result = grade_code(fenced(attack + ADD), GOLD, timeout_s=5, tmp_root=str(root))
        assert result.status == "error" and "PermissionError: sandbox" in result.stderr_tail, (
            attack,
            result.stderr_tail,
        )
    assert list(outside.iterdir()) == []
    # lowering a limit, and SQLite in memory or in the box, stay allowed
    fine = (
        "import resource, sqlite3\nresource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
        "sqlite3.connect(':memory:').execute('create table t (x)')\n"
        "sqlite3.connect('local.db').execute('create table t (x)')\n"
    )
    assert grade_code(fenced(fine + ADD), GOLD, timeout_s=5, tmp_root=str(root)).status == "passed"


def test_a_sleeping_tree_blocked_itself_and_a_spinning_one_did_not():
    # a job past its wall-clock backstop is judged by how its threads spent their lives: a sleep
    # (under a parent that waits) runs almost never, a spin runs or queues for a CPU all along
    import signal
    import time

    from stillroom import sandbox

    sleeper = subprocess.Popen(["sh", "-c", "sleep 30 & wait"], start_new_session=True)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        time.sleep(1.5)
        slept, spun = sandbox.runnable_share([sleeper.pid]), sandbox.runnable_share([spinner.pid])
        assert slept is not None and sandbox.blocked(slept), slept
        assert spun is not None and not sandbox.blocked(spun), spun
    finally:
        for proc in (sleeper, spinner):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert sandbox.runnable_share([sleeper.pid]) is None  # gone: /proc says nothing
