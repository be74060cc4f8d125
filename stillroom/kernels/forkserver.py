"""A warm fork server for kernel jobs: ``python -m stillroom.kernels.forkserver <device>
[<jobs root>]``.

A fresh process spends ~2 s importing torch and triton before a job runs. This server imports
them once, then forks a child per job that runs the job's ``main`` (extract.py or replay.py)
exactly as ``python -m stillroom.kernels.<role>`` does, in a session of its own. Given the jobs
root (under bubblewrap, with CAP_SYS_ADMIN in its user namespace), each child first makes itself
a namespace (sandbox.enter_job): its own PID namespace, private /tmp and job directory, the
other jobs hidden. The server is a fresh interpreter started by isolation.py, never a fork of the
caller (which may have threads, CUDA or a trainer), never runs candidate code, and never
initialises CUDA itself, so that each child can.

Protocol, one JSON object a line. In, on stdin: ``{"id": n, "dir": job dir, "role": "extract" |
"replay", "cpu_s": the job's CPU limit}``, and ``{"id": n, "kill": true}`` to kill job n's process
group if it has not been reaped yet (the server runs in a PID namespace of its own under bubblewrap,
so the caller cannot signal by pid). Out, on stdout: ``{"ready": pid}`` once the imports are done;
``{"id": n, "pid": pid}`` when a child has started (pids as the server sees them); ``{"id": n,
"started": true}`` when the job reached the code it runs for (a byte on a pipe its code cannot take
back); ``{"id": n, "exit": code, "stderr": tail, "runnable": share}`` when it has ended and been
reaped (``code`` as ``Popen.returncode``: negative for a signal; ``tail``: its last 4 KiB of
stderr; ``share``: for a job killed on request, sandbox.runnable_share of it then, else null). The
server exits on EOF of stdin, or when the thread that started it ends (PR_SET_PDEATHSIG); a child
dies with the server. Under bubblewrap the server is PID 1 of its namespace: it reaps the orphans
of its children too.

The server and its children are not dumpable: a candidate cannot read another's or the server's
/proc entries (its working directory, its open pipes, its memory), nor trace them.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import selectors
import signal
import sys
import traceback

from .. import sandbox
from . import extract, isolation, replay

MAINS = {"extract": extract.main, "replay": replay.main}

STDERR_TAIL = 4096
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4


def _prctl(option: int, value: int) -> None:
    """prctl(2), through a libc handle that lives only for the call: none stays where candidate
    code could reach it (a child calls this before its audit hook refuses ctypes.dlopen)."""
    if sys.platform.startswith("linux"):  # elsewhere the server ends on EOF only
        if ctypes.CDLL(None, use_errno=True).prctl(option, value) != 0:
            raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")


class _Child:
    def __init__(self, job_id: int, err: int, started: int):
        self.id, self.err, self.started, self.tail = job_id, err, started, b""
        self.runnable: float | None = None  # measured when it is killed (sandbox.runnable_share)

    def read(self, sel: selectors.BaseSelector) -> None:
        """What the child wrote to stderr so far; close the pipe at its end."""
        while self.err is not None:
            try:
                data = os.read(self.err, 65536)
            except BlockingIOError:
                return
            if data:
                self.tail = (self.tail + data)[-STDERR_TAIL:]
            else:
                sel.unregister(self.err)
                os.close(self.err)
                self.err = None

    def close(self, sel: selectors.BaseSelector) -> None:
        for name in ("err", "started"):
            fd = getattr(self, name)
            if fd is not None:
                sel.unregister(fd)
                os.close(fd)
                setattr(self, name, None)


def _run_child(job: dict, device: str, pipes: tuple[int, int], inherited: list[int],
               server: int, jobs_root: str | None) -> None:  # fmt: skip
    """In the forked child: become the job. Never returns."""
    err, started = pipes
    try:
        # its own process group: the server kills it, and anything it starts, with killpg
        os.setsid()
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != server:  # the server died before prctl
            os._exit(1)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        # a pipe, as for a process of its own: RLIMIT_FSIZE would stop writes to a file
        os.dup2(err, 2)
        # nothing of the server's: its protocol, other children's pipes
        for fd in {devnull, err, *inherited}:
            os.close(fd)
        scratch = job["dir"]
        # counted from the fork: the child's own time (and, under enter_job, its job's, which
        # the limit reaches by inheritance)
        isolation.limit_cpu(job["cpu_s"])
        if jobs_root is not None:
            _, writable = isolation.ROLES[job["role"]]
            scratch = sandbox.enter_job(scratch, list(writable), hide=jobs_root)
            os.environ.update(TMPDIR="/tmp", HOME="/tmp")
        os.chdir(scratch)

        def mark() -> None:
            os.write(started, b"s")
            os.close(started)

        MAINS[job["role"]](scratch, device, started=mark)
    # reported on stderr, like an uncaught error of a process of its own
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        os._exit(1)


def serve(device: str, jobs_root: str | None) -> None:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # also ends the children: they die with this process
    _prctl(_PR_SET_DUMPABLE, 0)  # inherited by every child (until an exec)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's; it closes our stdin
    # a caller's CPU limit (a grading worker's, per item) is not this long-lived server's
    resource.setrlimit(resource.RLIMIT_CPU, (resource.getrlimit(resource.RLIMIT_CPU)[1],) * 2)
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported
    import torch
    import triton
    from triton.runtime.jit import mangle_type

    # Triton imports more of itself at the first launch (its argument specialisation): once, here
    mangle_type(torch.empty(1))
    del triton

    if torch.cuda.is_initialized():
        raise RuntimeError(
            "the kernel fork server initialised CUDA before forking; its children could not use it"
        )
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints of libraries must not corrupt the protocol

    def send(**msg) -> None:
        out.write(json.dumps(msg) + "\n")

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that exits reach the wakeup fd
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ, "requests")
    sel.register(wake_r, selectors.EVENT_READ, "exits")
    children: dict[int, _Child] = {}
    pending, server = b"", os.getpid()
    send(ready=server)
    while True:
        for key, _ in sel.select():
            if key.data == "requests":
                chunk = os.read(0, 65536)
                if not chunk:
                    return  # the caller has gone
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    job = json.loads(line)
                    if job.get("kill"):
                        # only a child not reaped yet: a reaped one's pid may be reused
                        for pid, child in children.items():
                            if child.id == job["id"]:
                                child.runnable = sandbox.runnable_share([pid])
                                try:
                                    os.killpg(pid, signal.SIGKILL)
                                except ProcessLookupError:  # before its setsid
                                    os.kill(pid, signal.SIGKILL)
                        continue
                    err_r, err_w = os.pipe()
                    started_r, started_w = os.pipe()
                    inherited = [err_r, started_r, wake_r, wake_w, out.fileno(), sel.fileno()]
                    inherited += [
                        fd for c in children.values() for fd in (c.err, c.started) if fd is not None
                    ]
                    pid = os.fork()
                    if pid == 0:
                        _run_child(job, device, (err_w, started_w), inherited, server, jobs_root)
                    os.close(err_w)
                    os.close(started_w)
                    os.set_blocking(err_r, False)
                    os.set_blocking(started_r, False)
                    children[pid] = child = _Child(job["id"], err_r, started_r)
                    sel.register(err_r, selectors.EVENT_READ, child)
                    sel.register(started_r, selectors.EVENT_READ, ("started", child))
                    send(id=job["id"], pid=pid)
            elif key.data == "exits":
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                while True:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if not pid:
                        break
                    child = children.pop(pid, None)
                    if child is None:  # an orphan of a candidate: PID 1 inherits them
                        continue
                    child.read(sel)
                    _started(child, sel, send)
                    child.close(sel)  # held open by a descendant: what came so far
                    send(
                        id=child.id,
                        exit=os.waitstatus_to_exitcode(status),
                        stderr=child.tail.decode(errors="replace"),
                        runnable=child.runnable,
                    )
            elif isinstance(key.data, tuple):
                _started(key.data[1], sel, send)
            else:
                key.data.read(sel)


def _started(child: _Child, sel: selectors.BaseSelector, send) -> None:
    """Report once that the child's job has started, if it has said so; close that pipe."""
    if child.started is None:
        return
    try:
        data = os.read(child.started, 1)
    except BlockingIOError:
        return
    sel.unregister(child.started)
    os.close(child.started)
    child.started = None
    if data:
        send(id=child.id, started=True)


if __name__ == "__main__":
    try:
        serve(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
    except BrokenPipeError:  # the caller has gone
        pass
