"""The sglang backend's server lifecycle, with a stand-in server command (the fault-injection server
run as a program): start, health wait, generation, and stop on success, on failure and on
SIGTERM."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stillroom.data import sources
from stillroom.io import read_jsonl, write_jsonl
from stillroom.stages import generate
from stillroom.teachers import TeacherError

from ..conftest import TINY

STANDIN = str(Path(__file__).resolve().parents[1] / "fault_server.py")


def _spec(command, **server):
    return {
        "backend": "sglang",
        "model": "stand-in",
        "concurrency": 4,
        "backoff_base_s": 0.01,
        "server": {"command": command, "startup_timeout_s": 20, "stop_timeout_s": 5, **server},
    }


def _params(spec):
    return {"teacher": "selfhost", "spec": spec, "effort": "low", "samples": 2, "seed": 0}


def _shard(tmp_path, n=10):
    path = tmp_path / "shard.jsonl"
    write_jsonl(path, sources.generate("arithmetic", "a", n, 1, max_operand=12))
    return str(path)


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return subprocess.run(
        ["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True
    ).stdout.startswith("Z")


def test_server_is_started_used_and_stopped(tmp_path):
    from stillroom.runtime.service import Server

    seen = []
    original = Server.stop

    def spy(self):
        if self.proc is not None:
            pid = self.proc.pid
            seen.append((pid, os.getpgid(pid), os.getsid(pid)))
        original(self)

    Server.stop = spy
    try:
        out = str(tmp_path / "gen.jsonl")
        m = generate.run(
            shard=_shard(tmp_path),
            out_samples=out,
            log=lambda _: None,
            params=_params(_spec("{python} " + STANDIN + " {port} 0.5")),
        )
    finally:
        Server.stop = original
    rows = read_jsonl(out)
    assert m["samples"] == len(rows) == 20 and all(r["model"] == "stand-in-served" for r in rows)
    assert seen and all(_gone(pid) for pid, _, _ in seen)
    # its own process group (stopped whole), in the job's session: a session of its own would be a
    # scheduler autogroup of its own, at full weight whatever the job's niceness
    assert all(group == pid and session == os.getsid(0) for pid, group, session in seen)


def test_the_weights_the_server_reports_are_pinned(tmp_path, monkeypatch):
    """SGLang's /get_model_info names the weights: a hub cache snapshot is recorded by repository
    and commit, beside the model id the server answers as."""
    from stillroom.provenance.sidecars import Notes

    sha = "e" * 40
    snapshot = tmp_path / "hub/models--org--teacher/snapshots" / sha
    snapshot.mkdir(parents=True)
    notes = Notes()
    generate.run(
        shard=_shard(tmp_path, n=2),
        out_samples=str(tmp_path / "gen.jsonl"),
        log=lambda _: None,
        params=_params(_spec(f"{{python}} {STANDIN} {{port}} 0 {snapshot}")),
        notes=notes,
    )
    weights, served = notes.resolved
    assert (weights["role"], weights["id"], weights["revision"]) == (
        "teacher:selfhost",
        "org/teacher",
        sha,
    )
    assert weights["server"]["model_path"] == str(snapshot)
    assert served["served"] == ["stand-in-served"]


def test_a_server_that_dies_fails_fast_with_its_log(tmp_path):
    cmd = "{python} -c \"import sys; print('CUDA error: no device'); sys.exit(3)\" {port}"
    start = time.monotonic()
    with pytest.raises(
        TeacherError, match=r"server exited with 3 before it was healthy; log tail:\nCUDA error"
    ):
        generate.run(
            shard=_shard(tmp_path),
            out_samples=str(tmp_path / "gen.jsonl"),
            log=lambda _: None,
            params=_params(_spec(cmd)),
        )
    assert time.monotonic() - start < 10


def test_a_server_that_never_gets_healthy_is_killed(tmp_path):
    cmd = "{python} -c \"import time; print('loading weights'); time.sleep(600)\" {port}"
    with pytest.raises(TeacherError, match="not healthy after 1.5 s"):
        generate.run(
            shard=_shard(tmp_path),
            out_samples=str(tmp_path / "gen.jsonl"),
            log=lambda _: None,
            params=_params(_spec(cmd, startup_timeout_s=1.5)),
        )
    leftover = subprocess.run(
        ["pgrep", "-f", "loading weights"], capture_output=True, text=True
    ).stdout.split()
    assert not [p for p in leftover if not _gone(int(p))]


def test_sigterm_to_the_job_stops_the_server(tmp_path):
    marker = f"standin-{os.getpid()}"
    spec = _spec("{python} " + STANDIN + " {port} 0 " + marker)
    cmd = [
        sys.executable,
        "-m",
        "stillroom",
        "generate",
        "--shard",
        _shard(tmp_path, 400),
        "--out-samples",
        str(tmp_path / "gen.jsonl"),
        "--params",
        json.dumps({**_params(spec), "samples": 50}),
    ]
    log = tmp_path / "job.log"
    with open(log, "wb") as fh:
        job = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    partial = tmp_path / "gen.jsonl.partial"
    deadline = time.monotonic() + 60
    # a record after the fingerprint line: the server is up and answering
    while (
        not (partial.exists() and partial.read_bytes().count(b"\n") >= 2)
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    servers = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert servers, "the stand-in server should be running while the job generates"
    job.send_signal(signal.SIGTERM)
    assert job.wait(timeout=30) == 128 + signal.SIGTERM, log.read_text()[-3000:]
    deadline = time.monotonic() + 10  # the group was killed; a loaded machine reaps it late
    while not all(_gone(int(p)) for p in servers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(int(p)) for p in servers), log.read_text()[-3000:]
    assert not (tmp_path / "gen.jsonl").exists() and partial.exists()  # resumable, not finished


@pytest.mark.slow
def test_real_transformers_serve_as_the_served_teacher(tmp_path):
    """A real OpenAI-compatible server (`transformers serve`) with a tiny local student, through the
    sglang backend's lifecycle and the openai client: usage, finish_reason and the served model
    id."""
    from stillroom.runtime.student import build_model, train_tokenizer

    rows = sources.generate("arithmetic", "a", 200, 1, max_operand=12)
    train_tokenizer([r["prompt"] for r in rows], tmp_path / "tok", vocab_size=300, min_frequency=2)
    build_model(
        tmp_path / "tok",
        tmp_path / "model",
        seed=0,
        model=TINY,
    )
    model = str(tmp_path / "model")
    serve = str(Path(sys.executable).parent / "transformers")
    spec = {
        **_spec(
            f"{serve} serve {model} --host 127.0.0.1 --port {{port}} --device cpu",
            startup_timeout_s=120,
        ),
        "model": model,
        "concurrency": 2,
        "sampling": {"temperature": 1.0, "max_tokens": 12},
    }
    out = str(tmp_path / "gen.jsonl")
    m = generate.run(
        shard=_shard(tmp_path, 3),
        out_samples=out,
        log=lambda _: None,
        params={**_params(spec), "samples": 2},
    )
    got = read_jsonl(out)
    assert m["samples"] == len(got) == 6 and m["failed"] == 0
    for r in (
        got
    ):  # a random-weight student rarely says <|im_end|> within 12 tokens: most are cut at the cap
        assert (
            r["model"] == model
            and r["finish_reason"] in ("length", "stop")
            and isinstance(r["response"], str)
        )
        assert 0 < r["completion_tokens"] <= 12 and r["prompt_tokens"] > 0
    assert (
        len({r["response"] for r in got}) > 1
    )  # do_sample in the student's generation config: samples differ


def test_one_server_start_serves_several_efforts(tmp_path, monkeypatch):
    from stillroom.teachers.sglang import SGLangTeacher

    starts = []
    original = SGLangTeacher.astart

    async def counting(self):
        starts.append(1)
        await original(self)

    monkeypatch.setattr(SGLangTeacher, "astart", counting)
    out = str(tmp_path / "low+high.jsonl")  # an effort group's one file
    params = {**_params(_spec("{python} " + STANDIN + " {port}")), "efforts": ["low", "high"]}
    del params["effort"]  # one effort, or several efforts in one run
    m = generate.run(shard=_shard(tmp_path), out_samples=out, log=lambda _: None, params=params)
    assert (
        len(starts) == 1
        and m["per_effort"]["low"]["samples"] == m["per_effort"]["high"]["samples"] == 20
    )
    efforts = [r["effort"] for r in read_jsonl(out)]
    assert efforts == ["low"] * 20 + ["high"] * 20  # each effort's records together, in order
