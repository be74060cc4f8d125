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

Below the hook, enforced by the kernel whatever the code does: ``no_new_processes`` (a seccomp
filter: no fork, exec or clone but of a thread) and, in a fork server's child inside bubblewrap,
``enter_job`` (a namespace per job: its own PID namespace, /tmp and view of its directory).

Standard library only: the code grader's child runs this file in ``python -I -S -B``, where nothing
else can be imported.
"""

from __future__ import annotations

import glob
import os
import re
import resource
import shutil
import signal
import sys
from collections.abc import Callable, Iterable

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


# Wall time is only a far backstop of a job limited in CPU time (a job blocked, or starved on a
# machine under load, which must not change a verdict): this many times its CPU limit, plus a
# start-up allowance.
BACKSTOP_FACTOR = 10
BACKSTOP_EXTRA_S = 30.0


def backstop_s(cpu_s: float) -> float:
    """The wall-clock backstop of a job limited to ``cpu_s`` CPU seconds."""
    return BACKSTOP_FACTOR * cpu_s + BACKSTOP_EXTRA_S


# A job past its backstop that ran or waited to run less than this share of its life blocked itself
# (a sleep, a read that never returns): its own fault, not the machine's
BLOCKED_SHARE = 0.5


def runnable_share(pids: Iterable[int]) -> float | None:
    """The largest share of its life any thread of the process trees at ``pids`` spent running or
    waiting for a CPU (/proc's schedstat over the thread's age): near 1 for a job a busy machine
    starved, near 0 for one that blocked itself. None where /proc does not say."""
    try:
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    best, todo, seen = None, list(pids), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:  # ended meanwhile
            continue
        for tid in tids:
            task = f"/proc/{pid}/task/{tid}"
            try:
                with open(f"{task}/schedstat") as f:
                    ran_ns, waited_ns = (int(v) for v in f.read().split()[:2])
                with open(f"{task}/stat") as f:  # field 22, its start in ticks after boot
                    started = int(f.read().rsplit(")", 1)[1].split()[19]) / ticks
                with open(f"{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            except (OSError, ValueError, IndexError):
                continue
            age = uptime - started
            if age > 0:
                share = (ran_ns + waited_ns) / 1e9 / age
                best = share if best is None else max(best, share)
    return best


def blocked(share: float | None) -> bool:
    """Whether a job past its backstop, whose threads at best ran or waited ``share`` of their
    lives (``runnable_share``), blocked itself."""
    return share is not None and share < BLOCKED_SHARE


def out_of_cpu(returncode: int | None) -> bool:
    """Whether a process ended on SIGXCPU (its RLIMIT_CPU), as Popen or bwrap (128 + the signal)
    reports it."""
    return returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU)


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
                # mkdir of a directory that exists changes nothing (it raises FileExistsError):
                # libraries make their cache directories with makedirs(exist_ok=True) on every use
                if event == "os.mkdir" and os.path.isdir(target):
                    continue
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


# Kernel-enforced limits a process sets on itself before untrusted code runs: no new processes
# (a seccomp filter), and, inside a sandbox that may (a fork server's), a namespace of its own.
_CLONE_THREAD = 0x00010000
# (audit arch, {syscall: number}) of the architectures the filter knows
_SYSCALLS = {
    "x86_64": (0xC000003E, {"clone": 56, "fork": 57, "vfork": 58, "execve": 59, "execveat": 322,
                            "clone3": 435}),
    "aarch64": (0xC00000B7, {"clone": 220, "execve": 221, "execveat": 281, "clone3": 435}),
}  # fmt: skip


def no_new_processes() -> bool:
    """A seccomp filter on this process (and its threads): no fork, vfork, clone but of a thread,
    execve or execveat, ever again; threads still start (clone3 says ENOSYS, so the C library
    falls back to clone with CLONE_THREAD). Also sets no_new_privs. False (nothing done) on an
    architecture the filter does not know."""
    import ctypes
    import platform
    import struct

    arch = _SYSCALLS.get(platform.machine())
    if arch is None or not sys.platform.startswith("linux"):
        return False
    audit_arch, nr = arch
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38
    denied = [nr[n] for n in ("fork", "vfork", "execve", "execveat") if n in nr]
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, audit_arch), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    prog.append((jge, 0, 1, 0x40000000))  # x32 calls on x86_64: refused
    prog.append((ret, 0, 0, eperm))
    prog.append((jeq, 0, 1, nr["clone3"]))
    prog.append((ret, 0, 0, enosys))
    for n in denied:
        prog += [(jeq, 0, 1, n), (ret, 0, 0, eperm)]
    prog += [(jeq, 1, 0, nr["clone"]), (ret, 0, 0, allow)]
    prog += [(ld, 0, 0, 16), (jset, 0, 1, _CLONE_THREAD), (ret, 0, 0, allow), (ret, 0, 0, eperm)]
    raw = b"".join(struct.pack("HBBI", *insn) for insn in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Prog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, MODE_FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
    return True


_MS = {"rdonly": 1, "nosuid": 2, "nodev": 4, "noexec": 8, "remount": 32, "bind": 4096,
       "rec": 16384, "private": 1 << 18}  # fmt: skip
JOB_ROOT = "/tmp/job"  # where a job sees its own directory, in its namespace
JOB_TMP_BYTES = 64 << 20
JOB_TMP_INODES = 4096


def enter_job(job_dir: str, writable: list[str], hide: str, tmp_bytes: int = JOB_TMP_BYTES) -> str:
    """Give a job a namespace of its own; call in a fresh child of a fork server that runs inside
    bubblewrap with CAP_SYS_ADMIN in its user namespace (isolation.py), before any job code.

    New mount and PID namespaces: a private /tmp (a tmpfs of ``tmp_bytes`` and a few thousand
    files: what the job may write beyond its outputs), the job's directory at ``JOB_ROOT``
    read-only except the files of ``writable`` (its outputs, created by the caller), ``hide`` (the
    directory of every job) covered by an empty read-only tmpfs. The calling process forks the
    job's first process, PID 1 of the new PID namespace, and waits for it: when it ends, the
    kernel kills every process left in its namespace (a daemon cannot outlive its job), and the
    caller ends with its status (never returns). The job's process drops every capability and
    returns ``JOB_ROOT``."""
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]

    def call(result: int, what: str) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def mount(source, target, fstype, flags, data=None) -> None:
        call(
            libc.mount(
                source and source.encode(), target.encode(), fstype and fstype.encode(), flags,
                data and data.encode(),
            ),
            f"mount {target}",
        )  # fmt: skip

    call(libc.unshare(0x00020000 | 0x20000000), "unshare(CLONE_NEWNS | CLONE_NEWPID)")
    mount(None, "/", None, _MS["rec"] | _MS["private"])
    # held open: the job's directory, and what the sandbox shows under /tmp (this Python or
    # package, when they live there), which the private /tmp would hide
    held = [os.open(os.path.join(job_dir, n), os.O_PATH) for n in ["", *writable]]
    shown = []
    for point in _mounts_under("/tmp"):
        if (
            point == hide
            or point.startswith(hide + os.sep)
            or any(point.startswith(p + os.sep) for p, _ in shown)
        ):
            continue
        shown.append((point, os.open(point, os.O_PATH)))
    mount("tmpfs", "/tmp", "tmpfs", _MS["nosuid"] | _MS["nodev"],
          f"size={tmp_bytes},nr_inodes={JOB_TMP_INODES},mode=0700")  # fmt: skip
    for point, fd in shown:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(point, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(point), exist_ok=True)
            os.close(os.open(point, os.O_CREAT | os.O_WRONLY, 0o600))
        mount(f"/proc/self/fd/{fd}", point, None, _MS["bind"] | _MS["rec"])
        flags = os.statvfs(point).f_flag
        kept = sum(_MS[n] for n, f in (("nosuid", os.ST_NOSUID), ("nodev", os.ST_NODEV),
                                       ("noexec", os.ST_NOEXEC)) if flags & f)  # fmt: skip
        mount(None, point, None, _MS["remount"] | _MS["bind"] | _MS["rdonly"] | kept)
        os.close(fd)
    os.mkdir(JOB_ROOT, 0o700)
    mount(f"/proc/self/fd/{held[0]}", JOB_ROOT, None, _MS["bind"] | _MS["rec"])
    flags = os.statvfs(JOB_ROOT).f_flag
    kept = sum(_MS[n] for n, f in (("nosuid", os.ST_NOSUID), ("nodev", os.ST_NODEV),
                                   ("noexec", os.ST_NOEXEC)) if flags & f)  # fmt: skip
    mount(None, JOB_ROOT, None, _MS["remount"] | _MS["bind"] | _MS["rdonly"] | kept)
    for name, fd in zip(writable, held[1:], strict=True):
        mount(f"/proc/self/fd/{fd}", os.path.join(JOB_ROOT, name), None, _MS["bind"])
    for fd in held:
        os.close(fd)
    if os.path.isdir(hide):
        mount("tmpfs", hide, "tmpfs", _MS["rdonly"] | _MS["nosuid"] | _MS["nodev"],
              "size=4k,nr_inodes=2")  # fmt: skip
    alive_r, alive_w = os.pipe()  # the parent's end closes when it ends
    pid = os.fork()
    if pid:
        os.close(alive_r)
        while True:
            try:
                _, status, usage = os.wait4(pid, 0)
                break
            except InterruptedError:
                continue
        if os.WIFSIGNALED(status):  # end as it ended: the fork server reports the signal
            sig = os.WTERMSIG(status)
            cpu_limit = resource.getrlimit(resource.RLIMIT_CPU)[0]
            spent = usage.ru_utime + usage.ru_stime
            if sig == signal.SIGKILL and cpu_limit != resource.RLIM_INFINITY and spent >= cpu_limit:
                # PID 1 of a namespace ignores SIGXCPU: the hard limit's kill is its CPU limit
                sig = signal.SIGXCPU
            if sig != signal.SIGKILL:
                signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    os.close(alive_w)
    call(libc.prctl(1, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    os.set_blocking(alive_r, False)
    try:
        if os.read(alive_r, 1) == b"":  # the parent ended before the death signal was set
            os._exit(1)
    except BlockingIOError:
        pass
    os.close(alive_r)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]  # fmt: skip

    call(libc.prctl(47, 4, 0, 0, 0), "prctl(PR_CAP_AMBIENT_CLEAR_ALL)")
    call(libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()), "capset")
    call(libc.prctl(38, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    return JOB_ROOT


def _mounts_under(top: str) -> list[str]:
    """Mount points below ``top`` (not ``top`` itself), shallowest first, from mountinfo."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            raw = line.split()[4]
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), raw)
            if point.startswith(top.rstrip(os.sep) + os.sep):
                points.append(point)
    return sorted(dict.fromkeys(points), key=lambda p: (p.count(os.sep), p))


# The OS-level sandbox around the whole process: bubblewrap. The audit hook above stays on top.
_BWRAP_WARNED: list[bool] = []
_BWRAP_OK: dict[bool, bool] = {}
# the host's directories a sandbox with a minimal root sees (read-only), where they exist
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The directory this package was imported from (a checkout on PYTHONPATH or the editable install's):
# a sandboxed process is given it first on PYTHONPATH, so it runs this code, not another copy's.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    binds = _python_binds([os.path.dirname(os.path.abspath(__file__))])  # this package
    if readable is None:
        home = os.path.realpath(os.path.expanduser("~"))
        if home not in ("/", "") and os.path.isdir(home):
            cmd += ["--tmpfs", home]
        hidden = [home, "/tmp"] if home not in ("/", "") else ["/tmp"]
        for source, dest in binds:
            if any(dest == h or dest.startswith(h + os.sep) for h in hidden) or dest != source:
                cmd += ["--ro-bind", source, dest]
    else:
        for source, dest in sorted(set(binds) | set(_python_binds(readable, interpreter=False))):
            cmd += ["--ro-bind", source, dest]
    return cmd


def _python_binds(paths: list[str], interpreter: bool = True) -> list[tuple[str, str]]:
    """(source, destination) binds that show ``paths`` and, with ``interpreter``, this Python
    (its prefix, base prefix and the directory of its executable) at their real paths and at the
    paths they are known by: a venv reached through a symbolic link is started by that link's
    path, and must be found there inside the sandbox too."""
    known = list(paths)
    if interpreter:
        known += [sys.prefix, sys.base_prefix, os.path.dirname(sys.executable)]
    binds = []
    for path in known:
        real = os.path.realpath(path)
        if not os.path.exists(real):
            continue
        binds.append((real, real))
        absolute = os.path.abspath(path)
        if absolute != real:
            binds.append((real, absolute))
    return sorted(set(binds), key=lambda b: (b[1].count(os.sep), b))


def bwrap_available(gpu: bool = False) -> bool:
    """Whether bubblewrap can start this Python here with a namespace per job (isolation.py):
    bwrap installed, user namespaces allowed, the interpreter found inside (a venv reached through
    a symbolic link included). If not, one loud warning: untrusted code then runs under the audit
    hook, the seccomp filter and limits alone."""
    if gpu not in _BWRAP_OK:
        import subprocess
        import tempfile

        ok = shutil.which("bwrap") is not None
        why = "bwrap is not installed (Debian: apt-get install bubblewrap)"
        if ok:
            with tempfile.TemporaryDirectory(prefix="stillroom-probe-") as root:
                job = os.path.join(root, "job")
                os.mkdir(job)
                argv = [sys.executable, "-P", "-c", _PROBE, job, root]
                # bwrap clears the environment: without PYTHONPATH a checkout's package would be
                # looked for where the editable install points, which is not bound
                here = {"PYTHONPATH": PACKAGE_ROOT}
                for readable in (None, []):
                    probe = subprocess.run(
                        bwrap(argv, cwd=root, writable=[root], gpu=gpu, readable=readable,
                              caps=("CAP_SYS_ADMIN",), env=here),
                        capture_output=True,
                        text=True,
                    )  # fmt: skip
                    ok = probe.returncode == 0 and "job ok" in probe.stdout
                    if not ok:
                        why = (
                            f"bwrap cannot start {sys.executable} with a namespace per job here: "
                            f"{(probe.stderr or probe.stdout).strip()[-300:]}"
                        )
                        break
        _BWRAP_OK[gpu] = ok
        if not ok and not _BWRAP_WARNED:
            _BWRAP_WARNED.append(True)
            import warnings

            warnings.warn(
                f"NO OS SANDBOX: {why}. Untrusted candidates run with the audit hook, the seccomp "
                "filter and resource limits only, which a determined candidate can escape.",
                RuntimeWarning,
                stacklevel=2,
            )
            print(f"stillroom: WARNING: NO OS SANDBOX: {why}", file=sys.stderr)
    return _BWRAP_OK[gpu]


# what the probe runs inside bubblewrap: a job's namespace, as a fork server's child makes it
_PROBE = """
import os, sys
from stillroom import sandbox
inside = sandbox.enter_job(sys.argv[1], [], hide=sys.argv[2])
print("job ok" if os.getpid() == 1 and os.path.isdir(inside) else "job wrong", flush=True)
"""


def bwrap(
    argv: list[str],
    *,
    cwd: str,
    writable: list[str] = (),
    env: dict[str, str] | None = None,
    gpu: bool = False,
    readable: list[str] | None = None,
    as_pid_1: bool = False,
    caps: tuple[str, ...] = (),
    ro_binds: list[str] = (),
) -> list[str]:
    """``argv`` inside bubblewrap, started in ``cwd``: only the directories in ``writable`` may be
    written, ``env`` is the whole environment (no secret: the sandbox may see bwrap's command
    line as /proc/1/cmdline), ``gpu`` exposes the host's NVIDIA device nodes (/dev/nvidia*).
    ``readable``: None shows the host's whole root (read-only); a list of paths shows only the
    system directories, this Python and those paths (files or directories): ``cwd`` must be among
    them or ``writable``. ``as_pid_1``: ``argv`` is PID 1 of the sandbox instead of bwrap's
    reaper, whose descriptors (``argv``'s stdin, stdout and stderr) anything inside could open
    through /proc/1/fd; PID 1 must then reap orphans, and ignores the signals sent from inside
    that it has no handler for, SIGKILL and SIGSTOP included. ``caps``: capabilities kept in the
    sandbox's user namespace (CAP_SYS_ADMIN: a fork server makes each job a namespace).
    ``ro_binds``: paths shown read-only beyond ``readable`` (under the private /tmp, say)."""
    cmd = _bwrap_base(gpu, readable) + (["--as-pid-1"] if as_pid_1 else [])
    for cap in caps:
        cmd += ["--cap-add", cap]
    for path in ro_binds:
        real = os.path.realpath(path)
        cmd += ["--ro-bind", real, real]
    for path in writable:
        real = os.path.realpath(path)
        cmd += ["--bind", real, real]
    if readable is not None:
        cmd += ["--remount-ro", "/"]  # the empty root bwrap builds the minimal one on
    for key, value in (env or {}).items():
        cmd += ["--setenv", key, value]
    return [*cmd, "--chdir", os.path.realpath(cwd), "--", *argv]
