"""How kernel jobs run: forked from one warm server per process and device, shared by threads; a
hang is killed with its process group; a dead server is restarted; each job in a namespace of its
own (its processes end with it, its writes go to its outputs and a capped /tmp), none able to
start a process; a venv reached through a symbolic link is sandboxed all the same."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stillroom import sandbox
from stillroom.kernels import evaluate, isolation

from .test_validator import CHEATS, HONEST, RELU, candidate


def test_concurrent_evaluations_share_one_fork_server():
    server = isolation.fork_server("cpu")
    sources = [HONEST, CHEATS["wrong answer"][0], HONEST, CHEATS["input mutated in place"][0]]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda s: evaluate(RELU, s).reward, sources)) == [1, 0, 1, 0]
    assert isolation.fork_server("cpu") is server


def _descendants(pid: int) -> set[int]:
    """Processes below ``pid``, zombies included."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        kids = {p for p, pp in parents.items() if pp == parent}
        found |= kids
        todo += kids
    return found


def _settles(check, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_hang_is_killed_and_the_server_serves_on(monkeypatch):
    server = isolation.fork_server("cpu")
    idle = _descendants(server.proc.pid)  # under bubblewrap: its init and the server itself
    # the server kills its own child: this process signals nothing by a pid the server reported
    monkeypatch.setattr(os, "killpg", lambda *a: pytest.fail(f"killpg{a} in the caller"))
    r = evaluate(RELU, CHEATS["hangs"][0], timeout_s=2)
    assert (
        r.status == "timeout"
        and "ran out of its 2 CPU seconds (running the candidate)" in r.reasons
    )
    # killed and reaped: the job's own first process (the intermediate's child, killed with its
    # group) may be reaped by the server a moment after the job's end is reported
    assert _settles(lambda: _descendants(server.proc.pid) == idle)
    assert evaluate(RELU, HONEST).reward == 1
    assert isolation.fork_server("cpu") is server


@pytest.mark.slow
def test_a_dead_fork_server_is_restarted():
    server = isolation.fork_server("cpu")
    with ThreadPoolExecutor(1) as pool:
        hung = pool.submit(evaluate, RELU, CHEATS["hangs"][0], timeout_s=60)
        deadline = time.monotonic() + 30
        while (
            not any(job.pid for job in list(server.jobs.values())) and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        server.proc.kill()
        r = hung.result(timeout=30)  # at once, not after its timeout
    assert r.reward == 0 and any("the kernel fork server died" in reason for reason in r.reasons), (
        r.reasons
    )
    assert evaluate(RELU, HONEST).reward == 1
    assert isolation.fork_server("cpu") is not server


# A candidate that defeats its extraction's audit hook (the closure of os.mkfifo's wrapper holds
# the hook's refuse()) and then tries every way to leave something behind.
DAEMON = """
import ctypes
import os
import threading
import time


def attempt(fn):
    try:
        return "ok: " + repr(fn())
    except BaseException as exc:
        return type(exc).__name__


def forward_body(x):
    cells = dict(zip(os.mkfifo.__code__.co_freevars, os.mkfifo.__closure__))
    cells["refuse"].cell_contents = lambda *args: None
    got = {
        "fork": attempt(os.fork),
        "libc fork": attempt(lambda: ctypes.CDLL(None).fork()),
        "spawn": attempt(lambda: os.posix_spawn("/bin/sh", ["sh", "-c", "sleep 60"], {})),
        "system": attempt(lambda: os.system("sleep 60 &")),
    }
    if any(v in ("ok: 0",) for v in got.values()):  # the child: stay, and spoil other jobs
        os.setsid()
        while True:
            for root, _, files in os.walk("/"):
                for name in files:
                    if name == "channel.bin":
                        try:
                            with open(os.path.join(root, name), "r+b") as f:
                                f.write(bytes(4096))
                        except OSError:
                            pass
            time.sleep(0.05)
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    raise RuntimeError("REPORT " + repr(got))
"""


def test_a_daemon_from_one_candidate_cannot_change_the_next_ones_reward():
    """No process can be started from a job (seccomp), and none of it outlives the job (its PID
    namespace): an honest kernel still earns 1 and one writing zeros 0, run after run."""
    server = isolation.fork_server("cpu")
    idle = _descendants(server.proc.pid)
    attacker = (
        CHEATS["wrong answer"][0]
        .replace("class ModelNew", DAEMON + "\n\nclass ModelNew")
        .replace(
            "    def forward(self, x):\n", "    def forward(self, x):\n        forward_body(x)\n"
        )
    )
    r = evaluate(RELU, attacker, timeout_s=30)
    report = next(why for why in r.reasons if "REPORT" in why)
    assert r.reward == 0 and r.status == "scored", r
    for how in ("fork", "libc fork", "spawn", "system"):
        assert f"'{how}': 'ok: 0'" not in report, report
    assert "'fork': 'PermissionError'" in report and "'spawn': 'PermissionError'" in report
    assert _settles(lambda: _descendants(server.proc.pid) == idle)  # nothing left behind
    zeros = HONEST.replace("tl.maximum(x, 0.0)", "x * 0.0")
    assert [evaluate(RELU, HONEST).reward for _ in range(3)] == [1.0] * 3
    assert [evaluate(RELU, zeros).reward for _ in range(3)] == [0.0] * 3


needs_bwrap = pytest.mark.skipif(not sandbox.bwrap_available(), reason="bubblewrap cannot run here")

# As a fork server does, inside bubblewrap: a child enters a job's namespace and, as the job,
# leaves a daemon in a session of its own; the server side then looks for it once the job ended.
NAMESPACE_JOB = """
import os, subprocess, sys, time
from stillroom import sandbox

job, root, marker = sys.argv[1:4]
child = os.fork()
if child == 0:
    sandbox.enter_job(job, [], hide=root)
    subprocess.Popen(["/bin/sh", "-c", f"sleep 60; : {marker}"], start_new_session=True)
    time.sleep(0.2)
    os._exit(0)
os.waitpid(child, 0)
time.sleep(0.5)
left = []
for entry in os.listdir("/proc"):
    try:
        cmdline = open(f"/proc/{entry}/cmdline").read() if entry.isdigit() else ""
        if cmdline.startswith("/bin/sh") and marker in cmdline:
            left.append(entry)
    except OSError:
        pass
print("left", len(left), flush=True)
"""


@needs_bwrap
def test_every_process_of_a_job_ends_with_it(tmp_path):
    """The job's namespace alone (no seccomp filter here): a daemon in a new session dies when the
    job's first process ends."""
    import subprocess
    import sys

    job = tmp_path / "job"
    job.mkdir()
    marker = f"stillroom-daemon-{os.getpid()}"
    argv = sandbox.bwrap(
        [sys.executable, "-P", "-c", NAMESPACE_JOB, str(job), str(tmp_path), marker],
        cwd=str(tmp_path),
        writable=[str(tmp_path)],
        readable=[],
        caps=("CAP_SYS_ADMIN",),
    )
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "left 0", (out.stdout, out.stderr[-2000:])


def test_a_job_writes_its_outputs_only_and_at_most_its_share_of_tmp():
    source = CHEATS["wrong answer"][0].replace(
        "    def forward(self, x):\n",
        "    def forward(self, x):\n"
        "        import os\n"
        "        cells = dict(zip(os.mkfifo.__code__.co_freevars, os.mkfifo.__closure__))\n"
        "        cells['refuse'].cell_contents = lambda *a: None\n"
        "        import resource\n"
        "        got = {}\n"
        "        try:\n"
        "            resource.setrlimit(resource.RLIMIT_FSIZE, (-1, -1))\n"
        "        except ValueError as exc:\n"
        "            got['limit'] = str(exc)\n"
        "        try:\n"
        "            with open('/tmp/big', 'wb') as f:\n"
        "                for _ in range(200):\n"
        "                    f.write(bytes(1 << 20))\n"
        "            got['big'] = 'ok'\n"
        "        except OSError as exc:\n"
        "            got['big'] = exc.strerror\n"
        "        try:\n"
        "            open('new-file', 'w')\n"
        "            got['new'] = 'ok'\n"
        "        except OSError as exc:\n"
        "            got['new'] = exc.strerror\n"
        "        raise RuntimeError('REPORT ' + repr(got))\n",
    )
    r = evaluate(RELU, source)
    report = next(why for why in r.reasons if "REPORT" in why)
    # RLIMIT_FSIZE's hard limit is 0 too (a capped private /tmp behind it under bubblewrap)
    assert "not allowed to raise maximum limit" in report, report
    assert "'big': 'File too large'" in report, report
    if sandbox.bwrap_available():  # the job directory read-only; without it the audit hook only
        assert "'new': 'Read-only file system'" in report, report


@needs_bwrap
def test_a_venv_reached_through_a_symbolic_link_runs_sandboxed(tmp_path):
    """The interpreter is started by the path it is known by: the sandbox shows the venv there
    too, so the probe passes and candidates are scored, not failed as the harness."""
    import subprocess
    import sys

    link = tmp_path / "venv-link"
    link.symlink_to(Path(sys.prefix).resolve(), target_is_directory=True)
    code = (
        "import os; os.environ['TRITON_INTERPRET'] = '1'\n"
        "from pathlib import Path\n"
        "from stillroom import sandbox\n"
        "from stillroom.kernels import evaluate\n"
        "kernels = Path('stillroom/kernels')\n"
        "r = evaluate((kernels / 'problems/relu.py').read_text(),\n"
        "             (kernels / 'solutions/relu.py').read_text(), trials=1, cases=[])\n"
        "print(sandbox.bwrap_available(), r.status, r.reward)\n"
    )
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [str(link / "bin" / "python"), "-c", code],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.stdout.strip().endswith("True scored 1.0"), (out.stdout, out.stderr[-3000:])


@needs_bwrap
def test_a_checkout_on_pythonpath_runs_sandboxed_with_its_own_code(tmp_path):
    """A copy of the package under /tmp, imported through PYTHONPATH while the editable install
    points elsewhere: bwrap clears the environment, so the probe and the jobs are given this
    copy's directory; before, the probe looked for the package where the editable install points,
    failed, and candidates ran without the OS sandbox."""
    import shutil
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    checkout = tmp_path / "checkout"
    shutil.copytree(
        repo / "stillroom", checkout / "stillroom", ignore=shutil.ignore_patterns("__pycache__")
    )
    code = (
        "import os; os.environ['TRITON_INTERPRET'] = '1'\n"
        "from stillroom import sandbox\n"
        "from stillroom.kernels import evaluate, isolation\n"
        "kernels = os.path.join(sandbox.PACKAGE_ROOT, 'stillroom', 'kernels')\n"
        "read = lambda *p: open(os.path.join(kernels, *p)).read()\n"
        "r = evaluate(read('problems', 'relu.py'), read('solutions', 'relu.py'),\n"
        "             trials=1, cases=[])\n"
        "print(sandbox.PACKAGE_ROOT, sandbox.bwrap_available(), isolation._sandboxed('cpu'),\n"
        "      r.status, r.reward)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.stdout.split() == [str(checkout), "True", "True", "scored", "1.0"], (
        out.stdout,
        out.stderr[-3000:],
    )


@pytest.mark.slow
def test_a_candidate_that_sleeps_past_the_backstop_earns_0_not_harness():
    # no CPU spent, so the wall-clock backstop (40 s for 1 CPU second) ends it; the fork server
    # measures, before the kill, that it blocked itself: the candidate's fault, reward 0, which
    # GRPO learns from (a harness result would be dropped, and stop training past a share)
    r = evaluate(RELU, candidate("time.sleep(1000)\nreturn x", prelude="import time"), timeout_s=1)
    assert (r.status, r.reward) == ("timeout", 0.0), r
    assert "blocked itself past the wall-clock backstop of 40 s" in r.reasons[0], r.reasons
