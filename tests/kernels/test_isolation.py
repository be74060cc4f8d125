"""How kernel candidates run: forked from one warm server per process and device, shared by
threads; a hang is killed with its process group; a dead server is restarted."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stillroom.kernels import evaluate, isolation

from .test_validator import CHEATS, HONEST, RELU


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


def test_a_hang_is_killed_and_the_server_serves_on(monkeypatch):
    server = isolation.fork_server("cpu")
    idle = _descendants(server.proc.pid)  # under bubblewrap: its init and the server itself
    # the server kills its own child: this process signals nothing by a pid the server reported
    monkeypatch.setattr(os, "killpg", lambda *a: pytest.fail(f"killpg{a} in the caller"))
    r = evaluate(RELU, CHEATS["hangs"][0], timeout_s=2)
    assert r.reward == 0 and "timed out after 2 s" in r.reasons
    assert _descendants(server.proc.pid) == idle  # killed and reaped
    assert evaluate(RELU, HONEST).reward == 1
    assert isolation.fork_server("cpu") is server


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
