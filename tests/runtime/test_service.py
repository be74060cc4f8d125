"""`stillroom serve` (runtime/service.py): one server for the jobs of its allocation, reached
through its service file. With the fault-injection server run as a program (a real HTTP server in
its own process): the service file's states, a client generation job that starts no server of its
own, the stop on SIGTERM, no server left after a SIGKILL, a server that dies before it is healthy,
and a served job's journal that brings its records back without a request."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stillroom.config.generation import Server as ServerSpec
from stillroom.data import sources
from stillroom.io import read_jsonl, write_jsonl
from stillroom.runtime.service import ServerError, wait_ready
from stillroom.stages import generate

STANDIN = str(Path(__file__).resolve().parents[1] / "fault_server.py")


def _spec(command: str, **over) -> dict:
    return ServerSpec(command=command, startup_timeout_s=30, stop_timeout_s=5, **over).dump()


@pytest.fixture
def serve(tmp_path):
    """Start `stillroom serve` (the serve job, a process); every one started is killed after the
    test, whatever it asserted."""
    started: list[subprocess.Popen] = []

    def start(spec: dict, name: str = "teacher:t/000") -> tuple[subprocess.Popen, Path]:
        service = tmp_path / "serve" / "server-000.json"
        service.parent.mkdir(parents=True, exist_ok=True)
        log = tmp_path / "serve.log"
        cmd = [sys.executable, "-m", "stillroom", "serve", "--name", name]
        cmd += ["--spec", json.dumps(spec), "--out-service", str(service)]
        cmd += ["--server-log", str(log)]
        with open(log, "ab") as fh:
            started.append(subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT))
        return started[-1], service

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
    return not stat.stdout.startswith("Z")


def _servers(marker: str) -> list[int]:
    """The stand-in servers running with ``marker`` (not the serve job, whose spec names it)."""
    pattern = rf"fault_server.py [0-9]+ [0-9.]+ {marker}"
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found if _alive(int(p))]


def _until(check, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _client_params(spec: dict) -> dict:
    teacher = {"backend": "sglang", "model": "stand-in", "concurrency": 4, "server": spec}
    return {"teacher": "t", "spec": teacher, "effort": "low", "samples": 2, "seed": 0}


def _shard(tmp_path: Path, n: int = 6) -> str:
    path = tmp_path / "shard.jsonl"
    write_jsonl(path, sources.generate("arithmetic", "a", n, 1, max_operand=12))
    return str(path)


def test_one_server_serves_its_clients_and_stops_on_sigterm(tmp_path, serve):
    marker = f"served-{os.getpid()}-a"
    # the stand-in takes 1 s to come up: the service file says "starting" first
    spec = _spec(f"{{python}} {STANDIN} {{port}} 1 {marker}")
    proc, service = serve(spec)
    assert _until(service.exists), (tmp_path / "serve.log").read_text()
    states = [json.loads(service.read_text())["state"]]
    ready = wait_ready(service, 30)
    states.append(ready["state"])
    assert states == ["starting", "ready"] and ready["base_url"].startswith("http://127.0.0.1:")
    # the weights the server reports travel in the service file to its clients' provenance
    assert ready["model_info"]["model_path"] == marker
    (server_pid,) = _servers(marker)
    outs = []
    for i in range(3):  # three clients, one server: none starts its own
        out = str(tmp_path / f"gen-{i}.jsonl")
        generate.run(
            shard=_shard(tmp_path),
            out_samples=out,
            params=_client_params(spec),
            server=str(service),
            log=lambda _: None,
        )
        outs.append(read_jsonl(out))
        assert _servers(marker) == [server_pid]
    assert all(len(rows) == 12 and rows[0]["model"] == "stand-in-served" for rows in outs)
    proc.send_signal(signal.SIGTERM)  # Snakemake's stop once every client is done
    assert proc.wait(timeout=30) == 0
    assert _until(lambda: not _alive(server_pid), 10)
    log = (tmp_path / "serve.log").read_text()
    assert log.count("healthy after") == 1 and "stopping server teacher:t/000" in log


def test_a_killed_serve_job_takes_its_server_with_it(tmp_path, serve):
    """Snakemake SIGKILLs the jobs of a failed group: the server must not outlive its job."""
    marker = f"served-{os.getpid()}-b"
    proc, service = serve(_spec(f"{{python}} {STANDIN} {{port}} 0 {marker}"))
    wait_ready(service, 30)
    (server_pid,) = _servers(marker)
    proc.kill()
    proc.wait(timeout=10)
    assert _until(lambda: not _alive(server_pid), 10)


def test_a_server_that_dies_fails_its_clients_at_once(tmp_path, serve):
    cmd = "{python} -c \"import sys; print('CUDA error: no device'); sys.exit(3)\" {port}"
    proc, service = serve(_spec(cmd))
    assert proc.wait(timeout=30) == 1
    state = json.loads(service.read_text())
    assert state["state"] == "failed" and "CUDA error: no device" in state["error"]
    start = time.monotonic()
    with pytest.raises(ServerError, match=r"server-000.json: the server failed: .*exited with 3"):
        wait_ready(service, 600)
    assert time.monotonic() - start < 5  # not the client's timeout


def test_a_server_that_cannot_be_launched_fails_its_clients_at_once(serve):
    """A command that names no program (or a template key nothing fills) is no ServerError, and
    still fails the service rather than leaving it "starting" until every client times out."""
    for command in ("/nonexistent/python {port}", "{python} {no_such_key} {port}"):
        proc, service = serve(_spec(command))
        assert proc.wait(timeout=30) == 1
        state = json.loads(service.read_text())
        assert state["state"] == "failed" and (
            "nonexistent" in state["error"] or "no_such_key" in state["error"]
        )
        with pytest.raises(ServerError, match="the server failed"):
            wait_ready(service, 600)


def test_a_client_waits_no_longer_than_its_timeout(tmp_path):
    absent = tmp_path / "serve" / "server-009.json"
    with pytest.raises(ServerError, match=r"server-009.json: the server is not ready after 1 s"):
        wait_ready(absent, 1)


def test_a_served_jobs_journal_brings_its_records_back_without_a_request(tmp_path, serve):
    """Snakemake reruns every client of a server it starts (the service is an input made again)
    and deletes the finished outputs of a failed group: a served job keeps its journal, so its
    records come back without a request, even with its server gone."""
    marker = f"served-{os.getpid()}-c"
    spec = _spec(f"{{python}} {STANDIN} {{port}} 0 {marker}")
    proc, service = serve(spec)
    wait_ready(service, 30)
    out = tmp_path / "gen.jsonl"
    args = {"shard": _shard(tmp_path), "out_samples": str(out), "params": _client_params(spec)}
    generate.run(**args, server=str(service), log=lambda _: None)
    first = out.read_bytes()
    assert Path(f"{out}.partial").exists()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    out.unlink()
    lines = []
    generate.run(**args, server=str(service), log=lines.append)
    assert out.read_bytes() == first and "resuming: 12 samples already done" in lines
    # a job that starts its own server keeps no journal
    own = tmp_path / "own.jsonl"
    generate.run(**{**args, "out_samples": str(own)}, log=lambda _: None)
    assert own.exists() and not Path(f"{own}.partial").exists()
