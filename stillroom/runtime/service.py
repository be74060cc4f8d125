"""An OpenAI-compatible server (SGLang, vLLM, ``transformers serve``) started from a command
template: started in a job for that job alone (``Server``), or once per allocation for every job
there (``serve``, the body of ``stillroom serve``, which rules/serve.smk runs as a Snakemake service
job) and reached by those jobs through its service file (``wait_ready``).

The service file is the one channel between the server and its clients: JSON, replaced atomically,
``state`` "starting" (written before the server is launched, so that the clients, which Snakemake
starts once the file exists, wait for it rather than for Snakemake's latency-wait), then "ready"
(healthy; the weights it loaded) or "failed" (why, with its log's tail), so that a server that
never comes up fails its clients at once instead of at their timeout.

SGLang pins its own torch and CUDA stack, so it lives in its own environment (``envs/sglang.yaml``)
and is reached only over HTTP; the command template says which Python runs it. The server gets its
own process group, so that stopping it takes its workers down too, and dies with its parent: a
SIGKILL of the job (Snakemake kills a failed group's jobs) kills the server's main process (its
workers go with it where the server watches its parent, as SGLang's do).
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import functools
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..io import write_json
from ..provenance.sidecars import Notes, describe_model, now

POLL_S = 0.5


class ServerError(RuntimeError):
    """The server did not come up, or its service file says so."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def exit_on_sigterm(signum, frame):
    """A SIGTERM handler: unwind (finally blocks, atexit) instead of dying on the spot."""
    raise SystemExit(128 + signum)


# Looked up here, not in the forked child: an import there can deadlock on a lock another thread
# of the parent held when it forked.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def _die_with_parent(parent: int) -> None:
    """In the server's process, before exec: SIGKILL it when the process that started it dies
    (Linux prctl PR_SET_PDEATHSIG), and exit at once if that already happened."""
    _PRCTL(1, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


class Server:
    """One server from ``spec`` (a teacher's or eval.backend's ``server`` section, with its
    ``model_path``): ``astart`` launches it on a free port and waits for its health endpoint,
    ``stop`` terminates its process group."""

    def __init__(self, name: str, spec: Mapping[str, Any]):
        self.name, self.spec = name, spec
        self.port = free_port(spec["host"])
        self.root = f"http://{spec['host']}:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log_path: str | None = None

    @property
    def base_url(self) -> str:
        return self.root + "/v1"

    def command(self) -> list[str]:
        values = {k: v for k, v in self.spec.items() if isinstance(v, str | int | float)}
        return shlex.split(
            self.spec["command"].format(**values, port=self.port, python=sys.executable)
        )

    async def astart(self, log_path: str | None = None) -> dict[str, Any] | None:
        """Launch and wait until healthy; the weights the server reports loading (SGLang's
        ``/get_model_info``), or None where it has no such endpoint."""
        import aiohttp

        if log_path is None:
            fd, self.log_path = tempfile.mkstemp(prefix=f"stillroom-{self.name}-", suffix=".log")
            out = os.fdopen(fd, "wb")
        else:
            self.log_path, out = log_path, open(log_path, "ab")
        env = {**os.environ, **{k: str(v) for k, v in self.spec.get("env", {}).items()}}
        # stopped on SIGTERM (Snakemake's, SLURM's) and at exit, whoever started it
        atexit.register(self.stop)
        signal.signal(signal.SIGTERM, exit_on_sigterm)
        # its own process group (stop kills it whole) in the job's session: a new session would be
        # a new scheduler autogroup, which runs at full weight whatever the job's niceness
        with out:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                process_group=0,
                preexec_fn=functools.partial(_die_with_parent, os.getpid()) if _PRCTL else None,
            )
        deadline = time.monotonic() + self.spec["startup_timeout_s"]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as client:
            while True:
                if self.proc.poll() is not None:
                    raise ServerError(
                        f"{self.name}: server exited with {self.proc.returncode} before it was "
                        f"healthy; log tail:\n{self.log_tail()}"
                    )
                try:
                    async with client.get(self.root + self.spec["health_path"]) as resp:
                        if resp.status == 200:
                            break
                except (TimeoutError, aiohttp.ClientError):
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise ServerError(
                        f"{self.name}: server not healthy after {self.spec['startup_timeout_s']} s "
                        f"at {self.root}{self.spec['health_path']}; log tail:\n{self.log_tail()}"
                    )
                await asyncio.sleep(0.2)
            return await self._model_info(client)

    async def _model_info(self, client) -> dict[str, Any] | None:
        import aiohttp

        try:
            async with client.get(self.root + "/get_model_info") as resp:
                info = await resp.json(content_type=None) if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, ValueError):
            info = None
        return info if isinstance(info, dict) else None

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as fh:
                return "".join(fh.readlines()[-lines:])
        except (OSError, TypeError):
            return ""

    def stop(self) -> None:
        """Terminate the server's process group; kill it if it does not exit in time. A group
        whose leader has exited is killed too: its workers may live on."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=self.spec["stop_timeout_s"])
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        proc.wait(timeout=10)


def note_weights(notes: Notes | None, role: str, info: Mapping[str, Any] | None) -> None:
    """Record the weights a server loaded, where it says (SGLang: their path or hub id, pinned to a
    commit by ``describe_model``); other servers are identified by the model id they answer as."""
    if notes is not None and info and isinstance(info.get("model_path"), str):
        notes.add_resolved({**describe_model(info["model_path"], role), "server": dict(info)})


def serve(
    name: str,
    spec: Mapping[str, Any],
    out: str | Path,
    server_log: str | None = None,
    log: Callable[[str], None] = print,
) -> int:
    """Run one server until it is stopped (SIGTERM: Snakemake's, once every client is done; exit
    0) or dies (the service file says "failed"; exit 1), keeping ``out`` current for its clients.
    The server's own output is appended to ``server_log`` (the job's log)."""
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    record = {"name": name, "host": socket.gethostname(), "pid": os.getpid(), "started": now()}
    server = None
    try:
        t0 = time.monotonic()
        try:
            server = Server(name, spec)
            record["base_url"] = server.base_url
            write_json(out, {"state": "starting", **record})
            log(f"starting server {name} at {server.root}: {shlex.join(server.command())}")
            info = asyncio.run(server.astart(server_log))
        except (ServerError, OSError, KeyError, ValueError, ImportError) as exc:
            # anything that keeps it from serving fails its clients now, not at their timeout
            error = (
                str(exc)
                if isinstance(exc, ServerError)
                else f"{name}: cannot start `{spec.get('command')}`: {exc!r}"
            )
            write_json(out, {"state": "failed", **record, "error": error})
            log(error)
            return 1
        write_json(out, {"state": "ready", **record, "model_info": info, "ready": now()})
        log(f"server {name} healthy after {time.monotonic() - t0:.1f} s; serving")
        code = server.proc.wait()
        error = f"{name}: server exited with {code} while serving; log tail:\n{server.log_tail()}"
        write_json(out, {"state": "failed", **record, "error": error})
        log(error)
        return 1
    except SystemExit:
        log(f"stopping server {name}: its clients are done")
        return 0
    finally:
        if server is not None:
            server.stop()


def identity(ready: Mapping[str, Any]) -> dict[str, Any]:
    """What a client records of the server it used (its metrics' ``server``): which server, where,
    and since when, so that the cost ledger bills the allocation of a shared server once."""
    return {k: ready.get(k) for k in ("name", "host", "pid", "started")}


def _ready(path: str | Path, deadline: float, timeout_s: float) -> dict | None:
    """One look at a service file: its record once the server is ready, None while it starts; an
    error when it failed or ``deadline`` (of a ``timeout_s`` wait) has passed."""
    try:
        state = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        state = {"state": "absent"}  # not written yet, or being replaced
    if state.get("state") == "ready":
        return state
    if state.get("state") == "failed":
        raise ServerError(f"{path}: the server failed: {state.get('error')}")
    if time.monotonic() > deadline:
        raise ServerError(
            f"{path}: the server is not ready after {timeout_s:.0f} s (state "
            f"{state.get('state')!r}); see its serve job's log"
        )
    return None


def wait_ready(path: str | Path, timeout_s: float, log: Callable[[str], None] = print) -> dict:
    """The service file of a server this job is a client of, once the server is ready: a server
    that failed, or is not ready within ``timeout_s``, is an error naming the file."""
    deadline = time.monotonic() + timeout_s
    if (state := _ready(path, deadline, timeout_s)) is None:
        log(f"waiting for the server of {path}")
    while state is None:
        time.sleep(POLL_S)
        state = _ready(path, deadline, timeout_s)
    return state


async def await_ready(
    path: str | Path, timeout_s: float, log: Callable[[str], None] = print
) -> dict:
    """``wait_ready`` for a client inside an event loop."""
    deadline = time.monotonic() + timeout_s
    if (state := _ready(path, deadline, timeout_s)) is None:
        log(f"waiting for the server of {path}")
    while state is None:
        await asyncio.sleep(POLL_S)
        state = _ready(path, deadline, timeout_s)
    return state
