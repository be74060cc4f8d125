"""The one sandbox for untrusted code: resource limits and an audit hook, set up by the child
process itself before any of that code runs (never in ``preexec_fn``, which is unsafe when the
parent has threads). The code grader's programs and the kernel validator's candidates both run
under it.

The hook refuses starting processes, signalling other processes, ctypes, sockets and DNS, raising
a resource limit above its value when the hook was installed, and every write, delete, rename, link
or mode change outside ``box`` (with no box: anywhere), SQLite databases included; reading stays
allowed (imports need it). A caller may let some events through, e.g. a compiler started inside a
Triton launch. Python code cannot remove an audit hook, but a C extension or another path around it
could escape: this guards against careless, runaway or reward-gaming code, not a determined
attacker.

Standard library only: the code grader's child runs this file in ``python -I -S -B``, where nothing
else can be imported.
"""

from __future__ import annotations

import glob
import os
import resource
import shutil
import sys
from collections.abc import Callable

DENIED = frozenset(
    {
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.spawn",
        "pty.spawn",
        "os.kill",
        "os.killpg",
        "signal.pthread_kill",
        "ctypes.dlopen",
        "ctypes.dlsym",
        "socket.__new__",
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.sendmsg",
        "socket.getaddrinfo",
        "sys.remote_exec",
    }
)
# event -> ((index of a path argument, index of its dir_fd argument or None), ...)
PATH_EVENTS = {
    "os.remove": ((0, 1),),
    "os.rmdir": ((0, 1),),
    "os.mkdir": ((0, 2),),
    "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),),
    "os.utime": ((0, 3),),
    "os.truncate": ((0, None),),
    "os.symlink": ((1, 2),),
    "os.rename": ((0, 2), (1, 3)),
    "os.link": ((0, 2), (1, 3)),
    "os.setxattr": ((0, None),),
    "os.removexattr": ((0, None),),
    "os.chflags": ((0, None),),
    "shutil.rmtree": ((0, 1),),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def limit(
    *,
    cpu_s: int | None = None,
    memory_bytes: int | None = None,
    file_bytes: int | None = None,
    processes: int | None = None,
) -> None:
    """Resource limits of this process (and its children): CPU seconds (SIGXCPU, then a kill one
    second later), address space, file size, processes of this user; never a core dump."""
    for res, value in (
        (resource.RLIMIT_CPU, cpu_s),
        (resource.RLIMIT_AS, memory_bytes),
        (resource.RLIMIT_FSIZE, file_bytes),
        (resource.RLIMIT_NPROC, processes),
        (resource.RLIMIT_CORE, 0),
    ):
        if value is not None:
            hard = value + 1 if res == resource.RLIMIT_CPU else value
            resource.setrlimit(res, (value, hard))


def guard(
    box: str | Callable[[], str | None] | None,
    allow: Callable[[str, tuple], bool] | None = None,
) -> None:
    """Install the audit hook. ``box``: the one directory that may be written to (None: none), or
    a function saying which one at the moment of each event; ``allow(event, args)`` returning True
    lets through an event that would be refused."""
    readlink, realpath = os.readlink, os.path.realpath
    fixed = realpath(box) if isinstance(box, str) else None
    infinity = resource.RLIM_INFINITY
    fixed_limits = {
        getattr(resource, name): resource.getrlimit(getattr(resource, name))
        for name in dir(resource)
        if name.startswith("RLIMIT_")
    }

    def current() -> str | None:
        if callable(box):
            now = box()
            return realpath(now) if now is not None else None
        return fixed

    def where(path, dir_fd=None) -> str:
        if isinstance(path, int):  # an open file descriptor: where it points
            return readlink(f"/proc/self/fd/{path}")
        path = os.fsdecode(os.fspath(path))
        if dir_fd not in (None, -1) and not os.path.isabs(path):
            path = os.path.join(readlink(f"/proc/self/fd/{dir_fd}"), path)
        return realpath(path)  # symlinks resolved: a link in the box cannot point a write outside

    def inside(path: str) -> bool:
        root = current()
        return root is not None and (path == root or path.startswith(root + os.sep))

    def refuse(event: str, args: tuple, why: str) -> None:
        if allow is None or not allow(event, args):
            raise PermissionError(f"sandbox: {why} is not allowed")

    def hook(event: str, args: tuple) -> None:
        if event in DENIED:
            refuse(event, args, event)
        elif event == "import" and args[0] == "_posixsubprocess":
            refuse(event, args, "import _posixsubprocess")
        elif event == "sqlite3.connect":
            sqlite_target(args[0])
        elif event == "resource.setrlimit" and raises_limit(*args):
            refuse(event, args, "raising a resource limit")
        elif event == "resource.prlimit" and raises_limit(args[1], args[2]):
            refuse(event, args, "raising a resource limit")
        elif event == "open":
            path, mode, flags = args
            if path is None or isinstance(path, int):
                return
            target = where(path)
            if isinstance(flags, int):
                write = flags & _WRITE_FLAGS
            else:
                write = any(c in (mode or "") for c in "wax+")
            # A directory fd outside the box would allow dir_fd-relative writes.
            if not inside(target) and (write or (current() is not None and os.path.isdir(target))):
                refuse(
                    event, args, f"opening {target} for writing (or a directory) outside the box"
                )
        else:
            for i, j in PATH_EVENTS.get(event, ()):
                target = where(args[i], args[j] if j is not None else None)
                if not inside(target):
                    refuse(event, args, f"{event} on {target} outside the box")

    def sqlite_target(database) -> None:
        # sqlite3 creates and writes its files from C, unseen by the "open" event
        if isinstance(database, (str, bytes, os.PathLike)):
            name = os.fsdecode(os.fspath(database))
            if name == ":memory:":
                return
            if not name.startswith("file:") and inside(where(name)):
                return
        refuse("sqlite3.connect", (database,), f"an SQLite database at {database!r}")

    def raises_limit(res: int, limits) -> bool:
        if limits is None:  # a query
            return False
        soft, hard = limits
        old_soft, old_hard = fixed_limits.get(res, (infinity, infinity))

        def above(new, old):
            return old != infinity and (new == infinity or new > old)

        return above(soft, old_soft) or above(hard, old_hard)

    def guarded(fn):  # os.mkfifo and os.mknod raise no audit event
        def wrapper(path, *a, dir_fd=None, **k):
            if not inside(where(path, dir_fd)):
                refuse(fn.__name__, (path,), f"{fn.__name__} outside the box")
            return fn(path, *a, dir_fd=dir_fd, **k)

        return wrapper

    import _posixsubprocess
    import subprocess  # imported first, so that "import subprocess" still works

    fork_exec = _posixsubprocess.fork_exec

    def checked_fork_exec(*args, **kwargs):  # raises no audit event (multiprocessing calls it)
        refuse("_posixsubprocess.fork_exec", args, "_posixsubprocess.fork_exec")
        return fork_exec(*args, **kwargs)

    # subprocess keeps its own reference, taken at its import
    _posixsubprocess.fork_exec = subprocess._fork_exec = checked_fork_exec
    os.mkfifo, os.mknod = guarded(os.mkfifo), guarded(os.mknod)
    sys.addaudithook(hook)


# The OS-level sandbox around the whole process: bubblewrap. The audit hook above stays on top.
_BWRAP_WARNED: list[bool] = []
_BWRAP_OK: dict[bool, bool] = {}
# the host's directories a sandbox with a minimal root sees (read-only), where they exist
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
TMP_BYTES = 64 << 20  # the size of a minimal root's private /tmp


def _bwrap_base(gpu: bool, readable: list[str] | None = None) -> list[str]:
    """Namespaces and mounts shared by every sandboxed process: new user (no capabilities), PID,
    network, IPC, UTS and mount namespaces; a read-only root; a private /tmp; a cleared
    environment; killed when its parent dies. The root is the host's (the caller's home hidden:
    API keys, tokens), or with ``readable`` only the system directories, this Python and those
    paths (no repository, data, results or /etc to read, no host socket to connect to)."""
    # bwrap itself is started with an empty environment: it is PID 1 inside, and its
    # /proc/1/environ would show the caller's
    cmd = [
        "env",
        "-i",
        shutil.which("bwrap") or "bwrap",
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--cap-drop",
        "ALL",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
    ]
    if readable is None:
        cmd += ["--ro-bind", "/", "/"]
    else:
        for top in SYSTEM_DIRS:
            if os.path.islink(top):  # merged /usr: /bin -> usr/bin
                cmd += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                cmd += ["--ro-bind", top, top]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    if gpu:
        # the GPU's nodes alone: all of the host's /dev would open its disks to a sandbox whose
        # user owns them (root)
        for node in sorted(glob.glob("/dev/nvidia*")):
            cmd += ["--dev-bind", node, node]
    if readable is not None:
        # in memory: capped, so that writing to it cannot fill the host's RAM
        cmd += ["--size", str(TMP_BYTES)]
    cmd += ["--tmpfs", "/tmp"]
    # What Python needs: the interpreter (a pyenv one, a venv) and this package. Bound after the
    # mounts above, which would hide them (a checkout or a venv under /tmp, or the home).
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    python = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}
    if readable is None:
        home = os.path.realpath(os.path.expanduser("~"))
        if home not in ("/", "") and os.path.isdir(home):
            cmd += ["--tmpfs", home]
            for path in sorted(python | {package}):
                if path.startswith(home + os.sep):
                    cmd += ["--ro-bind", path, path]
        for path in sorted(python | {package}):
            if path == "/tmp" or path.startswith("/tmp/"):
                cmd += ["--ro-bind", path, path]
    else:
        for path in sorted(python | {os.path.realpath(p) for p in readable}):
            cmd += ["--ro-bind", path, path]
    return cmd


def bwrap_available(gpu: bool = False) -> bool:
    """Whether bubblewrap can start a sandbox here (installed, and user namespaces allowed); if
    not, one loud warning: untrusted code then runs under the audit hook and limits alone."""
    if gpu not in _BWRAP_OK:
        import subprocess

        ok = shutil.which("bwrap") is not None
        why = "bwrap is not installed (Debian: apt-get install bubblewrap)"
        # both roots: the minimal one needs a newer bwrap (--size)
        for readable in (None, []):
            if not ok:
                break
            probe = subprocess.run(
                bwrap(["/bin/true"], cwd="/", gpu=gpu, readable=readable),
                capture_output=True,
                text=True,
            )
            ok = probe.returncode == 0
            why = f"bwrap cannot start a sandbox here: {probe.stderr.strip()[-300:]}"
        _BWRAP_OK[gpu] = ok
        if not ok and not _BWRAP_WARNED:
            _BWRAP_WARNED.append(True)
            import warnings

            warnings.warn(
                f"NO OS SANDBOX: {why}. Untrusted candidates run with the audit hook and "
                "resource limits only, which a determined candidate can escape.",
                RuntimeWarning,
                stacklevel=2,
            )
            print(f"stillroom: WARNING: NO OS SANDBOX: {why}", file=sys.stderr)
    return _BWRAP_OK[gpu]


def bwrap(
    argv: list[str],
    *,
    cwd: str,
    writable: list[str] = (),
    env: dict[str, str] | None = None,
    gpu: bool = False,
    readable: list[str] | None = None,
    as_pid_1: bool = False,
) -> list[str]:
    """``argv`` inside bubblewrap, started in ``cwd``: only the directories in ``writable`` may be
    written, ``env`` is the whole environment (no secret: the sandbox may see bwrap's command
    line as /proc/1/cmdline), ``gpu`` exposes the host's NVIDIA device nodes (/dev/nvidia*).
    ``readable``: None shows the host's whole root (read-only); a list of paths shows only the
    system directories, this Python and those paths (files or directories): ``cwd`` must be among
    them or ``writable``. ``as_pid_1``: ``argv`` is PID 1 of the sandbox instead of bwrap's
    reaper, whose descriptors (``argv``'s stdin, stdout and stderr) anything inside could open
    through /proc/1/fd; PID 1 must then reap orphans, and ignores the signals sent from inside
    that it has no handler for, SIGKILL and SIGSTOP included."""
    cmd = _bwrap_base(gpu, readable) + (["--as-pid-1"] if as_pid_1 else [])
    for path in writable:
        real = os.path.realpath(path)
        cmd += ["--bind", real, real]
    if readable is not None:
        cmd += ["--remount-ro", "/"]  # the empty root bwrap builds the minimal one on
    for key, value in (env or {}).items():
        cmd += ["--setenv", key, value]
    return [*cmd, "--chdir", os.path.realpath(cwd), "--", *argv]
