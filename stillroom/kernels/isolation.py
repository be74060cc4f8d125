"""How a kernel candidate's worker process is run (worker.py): forked from a warm fork server that
has imported torch and triton once (forkserver.py; one server per calling process and device,
shared by its threads, restarted if it dies), or a fresh interpreter (~2 s more per candidate).
Either way it has a hard timeout, after which its whole process group is killed."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path


def run_process(work: Path, device: str, timeout_s: float) -> tuple[bool, int | None, str]:
    """A fresh interpreter runs the worker: (timed out, exit code, stderr)."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "stillroom.kernels.worker", str(work), device],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the worker and anything it started
        proc.communicate()
        return True, proc.returncode, ""
    return False, proc.returncode, stderr


def run_forked(work: Path, device: str, timeout_s: float) -> tuple[bool, int | None, str]:
    """A child of this process's warm fork server runs the worker: (timed out, exit code, stderr);
    the exit code is None when the server died while the candidate ran."""
    # a server that died before the candidate started: once more, on a fresh one
    for _ in range(2):
        server = fork_server(device)
        job = server.submit(work)
        if not job.done.wait(timeout_s):
            server.kill(job)
            job.done.wait()  # the server reports the exit, or dies
            return True, job.exit, ""
        if job.pid is not None:
            break
    return False, job.exit, job.stderr


class _Job:
    def __init__(self, work: Path):
        self.id, self.dir = next(_job_ids), work
        self.pid: int | None = None  # the candidate's process, once the server has forked it
        self.killed = False  # timed out before its pid arrived: killed when it does
        self.exit: int | None = None
        self.stderr = ""
        self.done = threading.Event()


class _ForkServer:
    """This process's side of one fork server (forkserver.py). Requests go to its stdin under a
    lock; a thread reads its replies and matches them to their jobs by id."""

    def __init__(self, device: str):
        self.device = device
        self.lock = threading.Lock()  # jobs, alive and every job's fields
        self.write_lock = threading.Lock()  # the server's stdin; never held with self.lock
        self.jobs: dict[int, _Job] = {}
        self.alive = True
        self.proc: subprocess.Popen | None = None
        self.ready = threading.Event()
        threading.Thread(
            target=self._serve, name=f"kernel-forkserver-{device}", daemon=True
        ).start()
        self.ready.wait()
        if not self.alive:
            code = self.proc.returncode if self.proc else None
            raise RuntimeError(
                f"the kernel fork server for device {device!r} failed to start (exit {code}); "
                "its error is on stderr"
            )

    def _serve(self) -> None:
        # This thread starts the server and lives as long as it does: PR_SET_PDEATHSIG fires when
        # the *thread* that started a process ends, and evaluate often runs on pool threads that
        # come and go.
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        if self.device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "stillroom.kernels.forkserver", self.device],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                text=True,
                bufsize=1,
            )
            for line in self.proc.stdout:
                msg = json.loads(line)
                if "ready" in msg:
                    self.ready.set()
                    continue
                with self.lock:
                    job = self.jobs[msg["id"]]
                    if "pid" in msg:
                        job.pid = msg["pid"]
                        if job.killed:
                            _killpg(job.pid)
                    else:
                        job.exit, job.stderr = msg["exit"], msg["stderr"]
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

    def submit(self, work: Path) -> _Job:
        job = _Job(work)
        with self.lock:
            alive = self.alive
            if alive:
                self.jobs[job.id] = job
        if alive:
            try:
                with self.write_lock:
                    self.proc.stdin.write(json.dumps({"id": job.id, "dir": str(work)}) + "\n")
                    self.proc.stdin.flush()
                return job
            except (OSError, ValueError):  # the server has died
                with self.lock:
                    self.jobs.pop(job.id, None)
        job.done.set()  # never started: no pid
        return job

    def kill(self, job: _Job) -> None:
        """Kill the job's process group (its candidate and anything it started), now or once it has
        one."""
        with self.lock:
            job.killed = True
            # Not once its exit is reported: the server has reaped it, and its pid may belong to
            # another.
            if job.pid is not None and not job.done.is_set():
                _killpg(job.pid)


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone
        pass


_job_ids = itertools.count()
_servers: dict[str, _ForkServer] = {}
_servers_lock = threading.Lock()


def fork_server(device: str) -> _ForkServer:
    """This process's live fork server for ``device``: started on first use, restarted once
    dead."""
    with _servers_lock:
        server = _servers.get(device)
        if server is None or not server.alive or server.proc.poll() is not None:
            server = _servers[device] = _ForkServer(device)
        return server


def _forget_servers() -> None:
    """In a forked child of this process: the servers' reader threads did not come along; start
    anew."""
    global _servers_lock
    _servers.clear()
    _servers_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_servers)
ISOLATIONS = {"fork": run_forked, "process": run_process}
