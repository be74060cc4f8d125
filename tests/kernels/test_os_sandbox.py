"""The OS layer around kernel candidates (bubblewrap, the namespace per job, the seccomp filter:
isolation.py) on its own: each candidate first defeats its extraction's audit hook, then tries
the escapes that worked before it: the grader's secrets, a connection to 127.0.0.1, files outside
its job directory, a shell, signals to processes outside, the fork server. Each attempt is
reported back in the candidate's error; the assertions are on what the test can see from
outside."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import textwrap
import time
import uuid
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stillroom import sandbox
from stillroom.kernels import evaluate, isolation

from .test_isolation import _descendants
from .test_validator import CHEATS, HONEST, RELU, candidate

needs_bwrap = pytest.mark.skipif(not sandbox.bwrap_available(), reason="bubblewrap cannot run here")

# Module-level helpers of every attacking candidate.
PRELUDE = '''
import json
import os
import sys


def unhook():
    """Defeat the extraction's audit hook: the closure of os.mkfifo's wrapper (sandbox.guard) holds
    the cell of the hook's refuse(), shared by all its checks. True once a write the hook refuses
    goes through (in the sandbox's private /tmp)."""
    cells = dict(zip(os.mkfifo.__code__.co_freevars, os.mkfifo.__closure__))
    cells["refuse"].cell_contents = lambda *args: None
    try:
        os.close(os.open("/tmp/probe", os.O_CREAT | os.O_WRONLY))
        return True
    except PermissionError:
        return False


def attempt(fn):
    try:
        out = fn()
        return "ok" if out is None else "ok: " + repr(out)[:200]
    except BaseException as exc:
        return type(exc).__name__ + ": " + str(exc)[:80]


def report(**what):
    raise RuntimeError("REPORT " + json.dumps(what))
'''


def attacker(forward: str, prelude: str = "") -> str:
    return candidate(forward, prelude=PRELUDE + textwrap.dedent(prelude))


def reported(result) -> dict:
    """What the candidate reported from inside, from its error among the reasons."""
    for why in result.reasons:
        if "REPORT " in why:
            # the reason may go on after the report: "(on trial 0)"
            return json.JSONDecoder().raw_decode(why.split("REPORT ", 1)[1])[0]
    raise AssertionError(f"the candidate reported nothing: {result.reasons}")


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory outside /tmp and the home (which the sandbox replaces with its own), holding a
    file the candidate tries to change."""
    base = "/var/tmp" if os.access("/var/tmp", os.W_OK) else str(Path(__file__).parents[2])
    path = Path(tempfile.mkdtemp(prefix="os-sandbox-", dir=base))
    (path / "victim.txt").write_text("keep")
    (path / "victim.txt").chmod(0o644)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@needs_bwrap
def test_the_callers_secrets_never_reach_a_candidate(monkeypatch):
    secret = f"sk-{uuid.uuid4().hex}"
    monkeypatch.setenv("STILLROOM_TEST_API_KEY", secret)
    # fork servers started before the secret was set would not have it: start afresh
    for server in list(isolation._servers.values()):
        server.proc.kill()
        server.proc.wait()
    source = attacker(
        """
        hook_off = unhook()
        texts = [repr(dict(os.environ))]
        for path in ["/proc/self/environ", "/proc/1/cmdline", f"/proc/{os.getppid()}/environ"]:
            texts.append(attempt(lambda: open(path, "rb").read().decode()))
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                texts.append(attempt(lambda: open(f"/proc/{entry}/environ", "rb").read().decode()))
        sys.stderr.write("\\n".join(texts))
        found = [t[t.find("STILLROOM_TEST_API_KEY"):][:80] for t in texts if "API_KEY" in t]
        report(hook_off=hook_off, found=found, env=sorted(os.environ))
        """
    )
    for how in ("fork", "process"):
        r = evaluate(RELU, source, isolation=how)
        got = reported(r)
        assert r.reward == 0 and got["hook_off"] and got["found"] == [], (how, got)
        assert not any(secret in why for why in r.reasons), how
        assert "STILLROOM_TEST_API_KEY" not in got["env"], got["env"]


@needs_bwrap
@pytest.mark.parametrize("how", ["fork", "process"])
def test_on_cpu_a_candidate_reads_nothing_of_the_repository_or_the_host(how, outside):
    """The CPU sandbox's root holds the system directories, this Python and this package only: no
    benchmark golds, results, /etc or shared filesystem to copy into an error message."""
    repo = Path(__file__).resolve().parents[2]
    source = attacker(
        f"""
        hook_off = unhook()
        paths = [{str(repo / "README.md")!r}, {str(outside / "victim.txt")!r}, "/etc/hostname"]
        report(hook_off=hook_off, read=[attempt(lambda: open(p).read()[:20]) for p in paths])
        """
    )
    got = reported(evaluate(RELU, source, isolation=how, timeout_s=60))
    assert got["hook_off"] and not any(r.startswith("ok") for r in got["read"]), got


@needs_bwrap
@pytest.mark.parametrize("how", ["fork", "process"])
def test_no_connection_leaves_the_sandbox(how):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        source = attacker(
            f"""
            hook_off = unhook()
            import socket
            direct = attempt(lambda: socket.create_connection(("127.0.0.1", {port}), timeout=2))
            code = "import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"
            # a child process, as subprocess._fork_exec started one before: none starts at all
            argv = [sys.executable, "-c", code]
            child = attempt(lambda: os.posix_spawn(sys.executable, argv, {{}}))
            report(hook_off=hook_off, direct=direct, child=child)
            """
        )
        r = evaluate(RELU, source, isolation=how, timeout_s=60)
        got = reported(r)
        assert got["hook_off"] and not got["direct"].startswith("ok"), got
        assert got["child"].startswith("PermissionError"), got
        with pytest.raises(BlockingIOError):  # nothing ever connected
            listener.accept()


@needs_bwrap
@pytest.mark.parametrize("how", ["fork", "process"])
def test_nothing_is_written_outside_the_sandbox(how, outside, tmp_path):
    home_leak = Path.home() / f"stillroom-os-sandbox-{uuid.uuid4().hex}"
    source = attacker(
        f"""
        hook_off = unhook()
        import ctypes, resource, sqlite3
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
        out = {str(outside)!r}
        flags = os.O_CREAT | os.O_WRONLY
        got = dict(
            hook_off=hook_off,
            open=attempt(lambda: os.close(os.open(out + "/created", flags, 0o644))),
            mkdir=attempt(lambda: os.mkdir(out + "/made")),
            symlink=attempt(lambda: os.symlink("/etc/passwd", out + "/link")),
            chmod=attempt(lambda: os.chmod(out + "/victim.txt", 0o777)),
            sqlite=attempt(lambda: sqlite3.connect(out + "/db").execute("create table t(x)")),
            shell=attempt(lambda: ctypes.CDLL(None).system(
                f"touch {{out}}/shell; echo x > {str(home_leak)!r}".encode())),
            tmp=attempt(lambda: os.makedirs({str(tmp_path / "made")!r})),
            home=attempt(lambda: open({str(home_leak)!r}, "w").close()),
        )
        report(**got)
        """
    )
    r = evaluate(RELU, source, isolation=how, timeout_s=60)
    got = reported(r)
    # no shell starts (the seccomp filter: system() cannot fork)
    assert got["hook_off"] and got["shell"] in ("ok: -1", "ok: 32512"), got
    for name in ("open", "mkdir", "symlink", "chmod", "sqlite"):
        assert not got[name].startswith("ok"), (name, got[name])
    # /tmp and the home are the sandbox's own: what was written there is gone with it
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    assert (outside / "victim.txt").stat().st_mode & 0o777 == 0o644
    assert list(tmp_path.iterdir()) == [] and not home_leak.exists()


@needs_bwrap
@pytest.mark.parametrize("how", ["fork", "process"])
def test_no_process_outside_the_sandbox_is_signalled(how):
    sentinel = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        source = attacker(
            f"""
            hook_off = unhook()
            import signal
            report(
                hook_off=hook_off,
                kill=attempt(lambda: os.kill({sentinel.pid}, signal.SIGKILL)),
                killpg=attempt(lambda: os.killpg({sentinel.pid}, signal.SIGKILL)),
                parent=attempt(lambda: os.kill({os.getpid()}, 0)),
            )
            """
        )
        got = reported(evaluate(RELU, source, isolation=how))
        assert got["hook_off"] and got["kill"].startswith("ProcessLookupError"), got
        time.sleep(0.2)
        assert sentinel.poll() is None
    finally:
        sentinel.kill()
        sentinel.wait()


def test_the_fork_server_keeps_no_libc_handle():
    source = attacker(
        """
        server = sys.modules["__main__"]  # python -m stillroom.kernels.forkserver
        report(file=server.__file__, names=[n for n in vars(server) if "libc" in n.lower()])
        """
    )
    got = reported(evaluate(RELU, source))
    assert got["file"].endswith("forkserver.py") and got["names"] == [], got


def test_outputs_are_compared_in_the_caller_not_in_any_job():
    r = evaluate(RELU, CHEATS["comparison patched"][0])
    assert r.reward == 0 and any(why.startswith("trial 0:") for why in r.reasons), r.reasons


@needs_bwrap
def test_a_candidate_can_neither_see_nor_signal_nor_speak_for_its_fork_server():
    """The job is PID 1 of a namespace of its own: the server is outside it (no parent pid, no
    pid to signal); the server's /proc entries (seen through the mount it inherited) are not
    dumpable, so its protocol's pipes cannot be opened (a forged line could end other jobs)."""
    server = isolation.fork_server("cpu")
    source = attacker(
        """
        hook_off = unhook()
        import signal
        got = dict(hook_off=hook_off, parent=os.getppid(), me=os.getpid())
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        for fd in (0, 1):
            got[f"fd{fd}"] = attempt(lambda: open(f"/proc/1/fd/{fd}", "w").write('{"id": 0}\\n'))
        got["signals"] = sorted({attempt(lambda p=p: os.kill(p, 0)) for p in pids if p != 1})
        report(**got)
        """
    )
    got = reported(evaluate(RELU, source))
    assert got["hook_off"] and (got["parent"], got["me"]) == (0, 1), got
    assert got["fd0"].startswith("PermissionError") and got["fd1"].startswith("PermissionError")
    assert all(s.startswith("ProcessLookupError") for s in got["signals"]), got
    assert evaluate(RELU, HONEST, timeout_s=30).reward == 1
    assert isolation.fork_server("cpu") is server


@needs_bwrap
def test_a_stopped_fork_server_is_killed_on_a_timeout(monkeypatch):
    monkeypatch.setattr(isolation, "KILL_GRACE_S", 1.0)
    server = isolation.fork_server("cpu")
    # stopped from outside (nothing inside can): it serves no kill request
    (pid,) = _descendants(server.proc.pid)  # under bwrap's --as-pid-1: the server alone
    os.kill(pid, signal.SIGSTOP)
    start = time.monotonic()
    r = evaluate(RELU, CHEATS["hangs"][0], timeout_s=2)
    # the candidate never started: the harness's failure, not the candidate's
    assert r.reward == 0 and r.status == "harness", r
    assert any("ran past the wall-clock backstop of 50 s" in why for why in r.reasons), r.reasons
    assert time.monotonic() - start < 50 + 15  # the backstop of 2 CPU seconds, then the grace
    assert evaluate(RELU, HONEST).reward == 1
    assert isolation.fork_server("cpu") is not server


@needs_bwrap
def test_a_job_cannot_find_another_jobs_directory():
    """In its namespace a job sees its own directory only (read-only but for its outputs): the
    jobs root is absent or an empty read-only directory there (nothing to list, nothing to
    chmod), and the other jobs' processes are not
    dumpable (their working directories cannot be read through /proc)."""
    root = str(isolation.jobs_root())
    slow = candidate(
        "time.sleep(4)\nout = torch.empty_like(x)\nlaunch(x, out)\nreturn out",
        prelude="import time",
    )
    spy = attacker(
        f"""
        time.sleep(1)
        hook_off = unhook()
        seen = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                seen.append(attempt(lambda: os.readlink(f"/proc/{{entry}}/cwd")))
        others = [s for s in seen if "job-" in s]
        report(
            hook_off=hook_off,
            listing=attempt(lambda: os.listdir({root!r})),
            chmod=attempt(lambda: os.chmod({root!r}, 0o777)),
            own=attempt(lambda: open("candidate.py", "a").write("#")),
            others=others,
        )
        """,
        prelude="import time",
    )
    with ThreadPoolExecutor(2) as pool:
        slow_r, spy_r = pool.map(lambda s: evaluate(RELU, s, timeout_s=60), [slow, spy])
    got = reported(spy_r)
    assert slow_r.reward == 1, slow_r.reasons
    # under /tmp (the job's own /tmp hides it) it is not even there; elsewhere it is empty
    assert got["hook_off"] and got["others"] == [], got
    assert got["listing"] == "ok: []" or got["listing"].startswith("FileNotFoundError"), got
    assert got["chmod"].startswith(("FileNotFoundError", "OSError: [Errno 30]")), got
    assert got["own"].startswith("OSError") and "Read-only" in got["own"], got


@pytest.mark.parametrize("how", ["fork", "process"])
def test_without_bubblewrap_one_loud_warning_and_the_audit_hook_alone(monkeypatch, capsys, how):
    monkeypatch.setattr(sandbox, "_BWRAP_OK", {})
    monkeypatch.setattr(sandbox, "_BWRAP_WARNED", [])
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.warns(RuntimeWarning, match="NO OS SANDBOX: bwrap is not installed"):
        assert evaluate(RELU, HONEST, isolation=how).reward == 1
    assert "WARNING: NO OS SANDBOX" in capsys.readouterr().err
    source, why = CHEATS["writes a file from Python (the audit hook refuses)"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = evaluate(RELU, source, isolation=how)
    assert [w for w in caught if "NO OS SANDBOX" in str(w.message)] == []  # once only
    assert r.reward == 0 and any(why in reason for reason in r.reasons), r.reasons
    if how == "fork":
        assert isolation.fork_server("cpu") is isolation._servers[("cpu", False)]


def test_a_job_directory_lives_under_the_jobs_root():
    with isolation.job_dir() as work:
        assert work.parent == isolation.jobs_root() and work.stat().st_mode & 0o777 == 0o700
    assert not work.exists()
    assert isolation.jobs_root().stat().st_mode & 0o777 == 0o300
