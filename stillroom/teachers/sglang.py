"""A teacher served inside the job: start SGLang (or any OpenAI-compatible server) from a command
template, wait for its health endpoint, generate through the ``openai`` backend, always stop it.

SGLang pins its own torch and CUDA stack, so it lives in its own environment (``envs/sglang.yaml``)
and is reached only over HTTP; the command template says which Python runs it. The server gets its
own process group so that stopping it (on success, failure, SIGTERM from Snakemake or SLURM, or
interpreter exit) takes its workers down too.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from ..config import SGLangSpec
from ..provenance.sidecars import Notes, describe_model
from .base import TeacherError
from .openai import OpenAITeacher


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _exit_on_sigterm(signum, frame):
    """A SIGTERM handler: unwind (finally blocks, atexit) instead of dying on the spot."""
    raise SystemExit(128 + signum)


class SGLangTeacher(OpenAITeacher):
    Spec = SGLangSpec

    def __init__(self, name: str, spec: Mapping[str, Any], notes: Notes | None = None):
        super().__init__(name, spec, notes)
        self.proc: subprocess.Popen | None = None
        self.log_path: str | None = None

    def command(self, port: int) -> list[str]:
        server = self.spec["server"]
        values = {k: v for k, v in server.items() if isinstance(v, str | int | float)}
        return shlex.split(server["command"].format(**values, port=port, python=sys.executable))

    async def astart(self) -> None:
        import aiohttp

        server = self.spec["server"]
        port = free_port(server["host"])
        fd, self.log_path = tempfile.mkstemp(prefix=f"stillroom-{self.name}-", suffix=".log")
        env = {**os.environ, **{k: str(v) for k, v in server.get("env", {}).items()}}
        # its own process group (stop kills it whole) in the job's session: a new session would be
        # a new scheduler autogroup, which runs at full weight whatever the job's niceness
        self.proc = subprocess.Popen(
            self.command(port), stdout=fd, stderr=subprocess.STDOUT, env=env, process_group=0
        )
        os.close(fd)
        atexit.register(self.stop)
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        root = f"http://{server['host']}:{port}"
        deadline = time.monotonic() + server["startup_timeout_s"]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as client:
            while True:
                if self.proc.poll() is not None:
                    raise TeacherError(
                        f"teacher '{self.name}': server exited with {self.proc.returncode} "
                        f"before it was healthy; log tail:\n{self.log_tail()}",
                        1,
                    )
                try:
                    async with client.get(root + server["health_path"]) as resp:
                        if resp.status == 200:
                            break
                except (TimeoutError, aiohttp.ClientError):
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise TeacherError(
                        f"teacher '{self.name}': server not healthy after "
                        f"{server['startup_timeout_s']} s at {root}{server['health_path']}; "
                        f"log tail:\n{self.log_tail()}",
                        1,
                    )
                await asyncio.sleep(0.2)
            await self._note_weights(client, root)
        self.spec["base_url"] = root + "/v1"

    async def _note_weights(self, client, root: str) -> None:
        """The weights the server loaded, where it says (SGLang's ``/get_model_info``: their path
        or hub id, pinned to a commit by ``describe_model``); other servers lack the endpoint and
        are identified by the served model id of their responses."""
        import aiohttp

        try:
            async with client.get(root + "/get_model_info") as resp:
                info = await resp.json(content_type=None) if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, ValueError):
            info = None
        if isinstance(info, dict) and isinstance(info.get("model_path"), str):
            role = f"teacher:{self.name}"
            self.notes.add_resolved({**describe_model(info["model_path"], role), "server": info})

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as fh:
                return "".join(fh.readlines()[-lines:])
        except (OSError, TypeError):
            return ""

    def stop(self) -> None:
        """Terminate the server's process group; kill it if it does not exit in time."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in (
            (signal.SIGTERM, self.spec["server"]["stop_timeout_s"]),
            (signal.SIGKILL, 10),
        ):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    async def aclose(self) -> None:
        await super().aclose()
        self.stop()
