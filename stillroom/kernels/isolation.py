"""How the two jobs of an evaluation run: the extraction (extract.py, candidate code) and the
replay (replay.py, checked programs only), each a process of its own under a limit of CPU time
(RLIMIT_CPU: SIGXCPU ends it, however busy the machine), with a far wall-clock backstop
(sandbox.backstop_s) after which it and everything it started are killed.

A job is forked from a warm fork server that has imported torch and triton once (forkserver.py;
one server per calling process and device, shared by its threads, restarted if it dies), or is a
fresh interpreter (``isolation="process"``, ~2 s more per job). Either way:

- inside bubblewrap where it runs (sandbox.bwrap): new PID, network and mount namespaces, a
  read-only root (on CPU only the system directories, this Python and this package; on a GPU the
  host's, for CUDA), the caller's home hidden, an environment holding only what Python, Triton
  and CUDA need (never the caller's secrets), dying with the caller;
- a namespace per job (sandbox.enter_job, in a fork server's child; bwrap itself for a fresh
  process): its own PID namespace, so that nothing it starts outlives it, its own /tmp (a capped
  tmpfs), its job directory read-only but for its output files, no other job's directory to list
  or reach;
- a seccomp filter (sandbox.no_new_processes) in the extraction, and in a CPU replay: no process
  can be started at all, threads only.

Where bubblewrap cannot run, one loud warning, and the seccomp filter, the audit hook and the
resource limits stand alone; the environment is cleared all the same. A fork server that cannot
start raises ``SandboxError``: no candidate is then scored at all, rather than every one as a
harness failure.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .. import sandbox

OS_SANDBOX = True  # False: never bubblewrap, even where it runs (bench: its cost)
KILL_GRACE_S = 10.0  # a server that has not reported a killed job's end by then is killed whole
# what the sandboxed process may see of the caller's environment: nothing else reaches it
PASSED_ENV = ("PYTHONPATH", "PATH", "LD_LIBRARY_PATH", "CC")
PASSED_ENV_PREFIXES = ("TRITON_", "CUDA_")
# each job's module and the files of its directory it may write (created by the caller)
ROLES = {
    "extract": ("stillroom.kernels.extract", ("out.bin",)),
    "replay": ("stillroom.kernels.replay", ("channel.bin", "result.bin")),
}


class SandboxError(RuntimeError):
    """The sandbox cannot run jobs here: nothing can be scored until that is fixed."""


@dataclass
class Outcome:
    timed_out: bool
    returncode: int | None  # None: the fork server died while the job ran
    stderr: str
    started: bool  # the job reached the code it runs for (candidate code, or the program)
    runnable: float | None = None  # timed out: sandbox.runnable_share of the job when killed

    @property
    def blocked(self) -> bool:
        """Past the backstop having blocked itself (slept, waited on nothing): its own fault."""
        return self.timed_out and sandbox.blocked(self.runnable)

    @property
    def out_of_cpu(self) -> bool:
        """Ended by its CPU limit: the job's own cost, not the machine's load."""
        return not self.timed_out and sandbox.out_of_cpu(self.returncode)


def limit_cpu(cpu_s: float) -> None:
    """A job's CPU limit, in the job's process (RLIMIT_CPU counts whole seconds)."""
    sandbox.limit(cpu_s=math.ceil(cpu_s))


def _sandboxed(device: str) -> bool:
    return OS_SANDBOX and sandbox.bwrap_available(gpu=device != "cpu")


def _readable(device: str, extra: list[str] = ()) -> list[str] | None:
    """What a sandbox on CPU may read beyond the system directories and this Python: this package
    (from each PYTHONPATH entry that has one) and ``extra``, never the repository, data or
    results around it. On a GPU the host's whole root (CUDA's libraries, /etc/ld.so.cache, /sys),
    the home hidden, and ``extra``."""
    if device != "cpu":
        return None
    roots = [sandbox.PACKAGE_ROOT]
    roots += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [
        os.path.join(root, "stillroom") if os.path.isdir(os.path.join(root, "stillroom")) else root
        for root in roots
        if os.path.isdir(root)
    ] + list(extra)


def _environment(device: str, home: str) -> dict[str, str]:
    """The whole environment of a job or fork server: HOME and TMPDIR in its writable area."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key in PASSED_ENV or key.startswith(PASSED_ENV_PREFIXES)
    }
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update(
        PYTHONPATH=os.pathsep.join([sandbox.PACKAGE_ROOT, *path]),
        PYTHONDONTWRITEBYTECODE="1",
        HOME=home,
        TMPDIR=home,
    )
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    return env


_root: dict[str, object] = {}
_root_lock = threading.Lock()


def jobs_root() -> Path:
    """This process's directory of job directories, created on first use and removed at exit.
    Mode 0o300: entries can be made and entered, not listed (where no namespace hides it)."""
    with _root_lock:
        if _root.get("pid") != os.getpid():  # a forked child makes its own
            path = Path(tempfile.mkdtemp(prefix="stillroom-kernel-jobs-"))
            (path / "home").mkdir()  # the fork servers' HOME and TMPDIR
            path.chmod(0o300)
            _root.update(pid=os.getpid(), path=path)
            atexit.register(_remove_root, path, os.getpid())
        return _root["path"]


def _remove_root(path: Path, owner: int) -> None:
    if os.getpid() == owner:
        with contextlib.suppress(OSError):
            path.chmod(0o700)
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def job_dir() -> Iterator[Path]:
    """A fresh directory for one evaluation's jobs under ``jobs_root()`` (mode 0o700), removed
    afterwards."""
    path = Path(tempfile.mkdtemp(prefix="job-", dir=jobs_root()))
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            path.chmod(0o700)
        shutil.rmtree(path, ignore_errors=True)


def run_process(work: Path, role: str, device: str, cpu_s: float) -> Outcome:
    """A fresh interpreter runs the job in ``work`` under ``cpu_s`` CPU seconds (its imports
    included); it prints "started" when it gets there."""
    module, writable = ROLES[role]
    # -P: neither the working directory nor the script's is put on sys.path
    argv = [sys.executable, "-P", "-m", module, str(work), device, str(cpu_s)]
    env = _environment(device, "/tmp")
    if _sandboxed(device):
        argv = sandbox.bwrap(
            argv,
            cwd=str(work),
            writable=[str(work / name) for name in writable],
            env=env,
            gpu=device != "cpu",
            readable=_readable(device, [str(work)]) if device == "cpu" else None,
            ro_binds=[str(work)] if device != "cpu" else (),
        )
    else:
        env["TMPDIR"] = env["HOME"] = str(work)
    proc = subprocess.Popen(
        argv,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=sandbox.backstop_s(cpu_s))
    except subprocess.TimeoutExpired:
        # the job and anything it started; under bubblewrap, killing bwrap (the group's leader, a
        # process of ours) ends its PID namespace with everything in it
        runnable = sandbox.runnable_share([proc.pid])
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
        return Outcome(True, proc.returncode, "", stdout.startswith("started"), runnable)
    return Outcome(False, proc.returncode, stderr, stdout.startswith("started"))


def run_forked(work: Path, role: str, device: str, cpu_s: float) -> Outcome:
    """A child of this process's warm fork server runs the job in ``work`` under ``cpu_s`` CPU
    seconds."""
    # a server that died before the job started: once more, on a fresh one
    for _ in range(2):
        server = fork_server(device)
        job = server.submit(work, role, cpu_s)
        if not job.done.wait(sandbox.backstop_s(cpu_s)):
            server.kill(job)
            if not job.done.wait(KILL_GRACE_S):  # a stopped or wedged server
                server.proc.kill()
                job.done.wait()
            return Outcome(True, job.exit, "", job.started, job.runnable)
        if job.pid is not None:
            break
    return Outcome(False, job.exit, job.stderr, job.started)


class _Job:
    def __init__(self, work: Path, role: str):
        self.id, self.dir, self.role = next(_job_ids), work, role
        # the job's pid in the server's PID namespace, once forked: never signalled here
        self.pid: int | None = None
        self.exit: int | None = None
        self.stderr = ""
        self.started = False
        self.runnable: float | None = None  # killed: the server's sandbox.runnable_share of it
        self.done = threading.Event()


class _ForkServer:
    """This process's side of one fork server (forkserver.py). Requests go to its stdin under a
    lock; a thread reads its replies and matches them to their jobs by id. The server kills its
    own children on request: under bubblewrap the pids it sees are not this process's."""

    def __init__(self, device: str):
        self.device = device
        self.lock = threading.Lock()  # jobs, alive and every job's fields
        self.write_lock = threading.Lock()  # the server's stdin; never held with self.lock
        self.jobs: dict[int, _Job] = {}
        self.alive = True
        self.proc: subprocess.Popen | None = None
        self.stderr = ""
        self.ready = threading.Event()
        threading.Thread(
            target=self._serve, name=f"kernel-forkserver-{device}", daemon=True
        ).start()
        self.ready.wait()
        if not self.alive:
            code = self.proc.returncode if self.proc else None
            raise SandboxError(
                f"the kernel fork server for device {device!r} failed to start (exit {code}): "
                f"{self.stderr.strip()[-1500:]}"
            )

    def _serve(self) -> None:
        # This thread starts the server and lives as long as it does: PR_SET_PDEATHSIG (and
        # bwrap's --die-with-parent) fires when the *thread* that started a process ends, and
        # evaluate often runs on pool threads that come and go.
        home = jobs_root() / "home"
        env = _environment(self.device, str(home))
        argv = [sys.executable, "-P", "-m", "stillroom.kernels.forkserver", self.device]
        if _sandboxed(self.device):
            argv.append(str(jobs_root()))  # a namespace per job, hiding this directory
            # PID 1 itself, not bwrap's reaper: that would hold the protocol's pipes where a
            # candidate could open them (/proc/1/fd); nor can a candidate stop or kill PID 1
            argv = sandbox.bwrap(
                argv,
                cwd=str(home),
                writable=[str(jobs_root())],
                env=env,
                gpu=self.device != "cpu",
                readable=_readable(self.device),
                as_pid_1=True,
                caps=("CAP_SYS_ADMIN",),
            )
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=home,
                env=env,
                text=True,
                bufsize=1,
            )
            threading.Thread(target=self._drain, daemon=True).start()
            for line in self.proc.stdout:
                msg = json.loads(line)
                if "ready" in msg:
                    self.ready.set()
                    continue
                with self.lock:
                    job = self.jobs.get(msg["id"])
                    if job is None:
                        continue
                    if "pid" in msg:
                        job.pid = msg["pid"]
                    elif "started" in msg:
                        job.started = True
                    else:
                        job.exit, job.stderr = msg["exit"], msg["stderr"]
                        job.runnable = msg.get("runnable")
                        del self.jobs[job.id]
                        job.done.set()
        finally:  # the server has gone (or spoke nonsense): fail what it was running
            with self.lock:
                self.alive = False
                for job in self.jobs.values():
                    job.done.set()
                self.jobs.clear()
            self.ready.set()
            if self.proc:
                self.proc.kill()
                self.proc.wait()

    def _drain(self) -> None:
        """The server's own stderr: kept (its last 8 KiB) for the error if it fails to start."""
        for line in self.proc.stderr:
            self.stderr = (self.stderr + line)[-8192:]
            if not self.ready.is_set():
                continue
            sys.stderr.write(line)

    def _send(self, msg: dict) -> bool:
        """False if the server has died."""
        try:
            with self.write_lock:
                self.proc.stdin.write(json.dumps(msg) + "\n")
                self.proc.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def submit(self, work: Path, role: str, cpu_s: float) -> _Job:
        job = _Job(work, role)
        with self.lock:
            alive = self.alive
            if alive:
                self.jobs[job.id] = job
        if alive:
            if self._send({"id": job.id, "dir": str(work), "role": role, "cpu_s": cpu_s}):
                return job
            with self.lock:
                self.jobs.pop(job.id, None)
        job.done.set()  # never started: no pid
        return job

    def kill(self, job: _Job) -> None:
        """Have the server kill the job's process group (and with it, the job's namespace).
        Requests are served in order, so the job has been forked by then; one already reaped is
        left alone (its pid may be another's)."""
        self._send({"id": job.id, "kill": True})


_job_ids = itertools.count()
_servers: dict[tuple[str, bool], _ForkServer] = {}
_servers_lock = threading.Lock()


def fork_server(device: str) -> _ForkServer:
    """This process's live fork server for ``device``: started on first use, restarted once
    dead."""
    key = (device, _sandboxed(device))
    with _servers_lock:
        server = _servers.get(key)
        if server is None or not server.alive or server.proc.poll() is not None:
            server = _servers[key] = _ForkServer(device)
        return server


def _forget_servers() -> None:
    """In a forked child of this process: the servers' reader threads did not come along; start
    anew."""
    global _servers_lock, _root_lock
    _servers.clear()
    _servers_lock = threading.Lock()
    _root_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_servers)
ISOLATIONS = {"fork": run_forked, "process": run_process}
