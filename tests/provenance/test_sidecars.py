"""Provenance sidecars: credentials redacted and environment variables allowlisted, directories
digested file by file, source files hashed, hub revisions resolved, git's diff hashed, the
environment locked once per run."""

import hashlib
import importlib.metadata
import json
import platform
import shutil
import subprocess

from stillroom.io import read_json, write_jsonl
from stillroom.provenance import envlock
from stillroom.provenance import sidecars as provenance
from stillroom.provenance.sidecars import (
    Job,
    Notes,
    digest,
    now,
    redact,
    sidecar_path,
    write_sidecars,
)


def test_redact_and_directory_digest(tmp_path):
    assert redact({"a": {"token": "t", "n": 1}, "list": [{"password": "p"}]}) == {
        "a": {"token": "<redacted>", "n": 1},
        "list": [{"password": "<redacted>"}],
    }
    counts = {
        "max_tokens": 5,
        "max_new_tokens": 6,
        "completion_tokens": 7,
        "daily_output_tokens": 8,
    }
    assert redact(counts) == counts  # token counts are not credentials
    assert redact({"hf_token": "x", "OPENAI_API_KEY": "y", "api_key_env": "OPENAI_API_KEY"}) == {
        "hf_token": "<redacted>",
        "OPENAI_API_KEY": "<redacted>",
        "api_key_env": "OPENAI_API_KEY",
    }
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.bin").write_bytes(b"1")
    first = digest(tmp_path / "d")
    assert set(first["files"]) == {"x.bin"}
    (tmp_path / "d" / "x.bin").write_bytes(b"2")
    assert digest(tmp_path / "d")["sha256"] != first["sha256"]


def test_sidecars_redact_credential_params(tmp_path, monkeypatch):
    """What no stage's typed params let through the CLI any more: a credential-like param is never
    written to a sidecar, nor a credential-like STILLROOM_* environment variable."""
    monkeypatch.setenv("STILLROOM_API_KEY", "sk-secret")
    out = tmp_path / "t.md"
    out.write_text("table")
    params = {"seed": 0, "api_key": "sk-secret", "api_key_env": "OPENAI_API_KEY"}
    write_sidecars({"markdown": out}, {}, stage="tables", params=params, started=now())
    prov = read_json(sidecar_path(out))
    assert "sk-secret" not in json.dumps(prov) and prov["params"]["api_key"] == "<redacted>"
    assert prov["params"]["api_key_env"] == "OPENAI_API_KEY"


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_git_state_hashes_the_diff_and_lists_untracked_files(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text("ignored.txt\n")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    clean = provenance.git_state(str(repo))
    assert clean["dirty"] is None and len(clean["commit"]) == 40
    (repo / "a.py").write_text("x = 2\n")
    (repo / "new.py").write_text("")
    (repo / "ignored.txt").write_text("")
    provenance.git_state.cache_clear()
    dirty = provenance.git_state(str(repo))["dirty"]
    diff = subprocess.run(
        ["git", "-C", str(repo), "diff", "HEAD", "--binary"], capture_output=True, check=True
    ).stdout
    assert dirty == {"diff_sha256": hashlib.sha256(diff).hexdigest(), "untracked": ["new.py"]}


def test_the_environment_is_an_allowlist_and_no_key_value_is_written(tmp_path, monkeypatch):
    secrets = {
        "STILLROOM_OPENAI_KEY": "sk-stillroom-openai-0001",
        "MY_TOKEN": "tok-my-token-0002",
        "STILLROOM_SECRET_THING": "s3cr3t-thing-0003",
        "STILLROOM_GPU_PARTITION": "sk-stillroom-openai-0001",  # allowlisted, holding the key
    }
    for k, v in secrets.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("SOME_UNLISTED_VARIABLE", "x")
    # a teacher's key variable named like an allowlisted one is still left out
    assert provenance.environment({"CUDA_VISIBLE_DEVICES"}).get("CUDA_VISIBLE_DEVICES") is None
    env = provenance.environment()
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert not {"STILLROOM_OPENAI_KEY", "MY_TOKEN", "STILLROOM_SECRET_THING"} & env.keys()
    assert "SOME_UNLISTED_VARIABLE" not in env
    out = tmp_path / "t.md"
    out.write_text("table")
    # the key's value also where no credential-like key names it (a server command line)
    params = {
        "seed": 0,
        "spec": {
            "api_key_env": "STILLROOM_OPENAI_KEY",
            "server": {"command": "serve --api-key sk-stillroom-openai-0001"},
        },
    }
    write_sidecars({"markdown": out}, {}, stage="tables", params=params, started=now())
    text = sidecar_path(out).read_text()
    assert not [v for v in secrets.values() if v in text]
    assert read_json(sidecar_path(out))["params"]["spec"]["api_key_env"] == "STILLROOM_OPENAI_KEY"


def _fake_hub(cache, kind, repo_id, sha, files=("config.json",)):
    folder = cache / f"{kind}s--{repo_id.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(sha)
    snap = folder / "snapshots" / sha
    snap.mkdir(parents=True)
    for name in files:
        (snap / name).write_text("{}")
    return snap


def test_hub_revisions_resolve_from_the_cache_and_local_models_are_hashed(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model_sha, data_sha = "a" * 40, "b" * 40
    snap = _fake_hub(cache, "model", "org/tiny", model_sha)
    _fake_hub(cache, "dataset", "org/data", data_sha)
    assert provenance.hub_revision("org/tiny") == {"revision": model_sha, "via": "cache"}
    assert provenance.hub_revision("org/data", "dataset")["revision"] == data_sha
    assert provenance.hub_revision("org/tiny", revision="c" * 40)["via"] == "pinned"
    missing = provenance.hub_revision("org/other")
    assert missing["revision"] is None and "no cached ref" in missing["error"]
    # a snapshot directory is known by its repository and commit
    assert provenance.describe_model(str(snap), "student") | {"ref": None} == {
        "role": "student",
        "ref": None,
        "id": "org/tiny",
        "revision": model_sha,
    }
    local = tmp_path / "weights"
    local.mkdir()
    (local / "model.safetensors").write_bytes(b"123")
    first = provenance.describe_model(str(local), "teacher:t")["manifest_sha256"]
    (local / "model.safetensors").write_bytes(b"1234")
    assert provenance.describe_model(str(local), "teacher:t")["manifest_sha256"] != first

    notes = Notes()
    notes.add_model("org/tiny", "student")  # a hub id
    notes.add_model(str(local), "student")  # a local directory: hashed as an input
    notes.add_dataset("org/data", "source:d", subset=None, split="train", revision=None)
    notes.add_model("org/tiny", "student")  # noted once
    noted = notes.sidecar_fields()
    assert noted["read"] == [str(local)]
    assert [(r["id"], r["revision"]) for r in noted["resolved"]] == [
        ("org/tiny", model_sha),
        ("org/data", data_sha),
    ]
    assert Notes().sidecar_fields() == {"read": [], "resolved": []}


def test_a_pretrained_student_from_a_hub_snapshot_records_its_commit(setup, tmp_path, monkeypatch):
    from stillroom.stages.student import run_pretrained

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    sha = "d" * 40
    snap = _fake_hub(tmp_path / "hub", "model", "org/student", sha, files=())
    shutil.rmtree(snap)
    shutil.copytree(setup / "base", snap)
    notes = Notes()
    run_pretrained(
        out_model=str(tmp_path / "out"), params={"pretrained": str(snap)}, log=print, notes=notes
    )
    (entry,) = notes.resolved
    assert entry["id"] == "org/student" and entry["revision"] == sha


def test_the_pool_hashes_its_local_source_files(tmp_path, monkeypatch):
    """A source read through the pool's params is an input of its sidecar: editing it makes the
    pool stale."""
    from stillroom.cli import main
    from stillroom.provenance.audit import audit

    monkeypatch.chdir(tmp_path)
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1), "kind": "math"} for i in range(5)]
    write_jsonl(tmp_path / "src.jsonl", rows)
    params = {
        "sources": [
            {"name": "gen", "kind": "arithmetic", "count": 40, "max_operand": 9},
            {"name": "file", "kind": "jsonl", "path": str(tmp_path / "src.jsonl")},
        ],
        "heldout": {"size": 4, "dev_size": 2},
    }
    outs = [f"--out-{k}=results/x/pool/{k}.jsonl" for k in ("pool", "heldout", "dev")]
    assert main(["pool", "--benchmarks", *outs, "--params", json.dumps(params)]) == 0
    prov = read_json("results/x/pool/pool.jsonl.prov.json")
    (read,) = prov["inputs"]["read"]
    assert read["path"] == "src.jsonl" and read["sha256"] == digest("src.jsonl")["sha256"]
    assert audit("results/x/pool/pool.jsonl").ok
    write_jsonl(tmp_path / "src.jsonl", rows[:-1])
    report = audit("results/x/pool/pool.jsonl")
    assert [(p.kind, p.input) for p in report.problems] == [("stale", "src.jsonl")]


def test_successive_stages_in_one_process_keep_their_own_notes(tmp_path, monkeypatch):
    """Each stage run gets its own notes: what one job read is not in the next job's sidecar
    (two pools in one process: a source file, then none, then another file)."""
    from stillroom.cli import main

    monkeypatch.chdir(tmp_path)
    generated = {"name": "gen", "kind": "arithmetic", "count": 40, "max_operand": 9}
    for name in ("a", "b"):
        write_jsonl(
            tmp_path / f"{name}.jsonl", [{"prompt": f"{name}?", "answer": "1", "kind": "math"}]
        )
    runs = {
        "first": [generated, {"name": "file", "kind": "jsonl", "path": "a.jsonl"}],
        "second": [generated],
        "third": [generated, {"name": "file", "kind": "jsonl", "path": "b.jsonl"}],
    }
    for run, sources in runs.items():
        params = {"sources": sources, "heldout": {"size": 4, "dev_size": 2}}
        outs = [f"--out-{k}=results/{run}/{k}.jsonl" for k in ("pool", "heldout", "dev")]
        assert main(["pool", "--benchmarks", *outs, "--params", json.dumps(params)]) == 0
    read = {
        run: [
            r["path"]
            for r in read_json(f"results/{run}/pool.jsonl.prov.json")["inputs"].get("read", [])
        ]
        for run in runs
    }
    assert read == {"first": ["a.jsonl"], "second": [], "third": ["b.jsonl"]}


def test_the_environment_lock_is_written_once_and_referenced_by_hash(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    snapshot = tmp_path / "results/x/config/cfg.json"
    snapshot.parent.mkdir(parents=True)
    snapshot.write_text(json.dumps({"seed": 1}))
    job = Job(rule="r", config_path=str(snapshot))
    for name in ("a", "b"):
        out = tmp_path / f"results/x/{name}.md"
        out.write_text(name)
        write_sidecars({"markdown": out}, {}, stage="tables", params={}, started=now(), job=job)
    (lock,) = (tmp_path / "results/x/env").iterdir()
    refs = {json.dumps(read_json(f"results/x/{n}.md.prov.json")["env_lock"]) for n in "ab"}
    assert refs == {
        json.dumps({"path": f"results/x/env/{lock.name}", "sha256": envlock.current_hash()})
    }
    recorded = read_json(lock)
    assert recorded["python"] == platform.python_version()
    assert recorded["packages"]["pytest"] == importlib.metadata.version("pytest")
    assert envlock.diff(recorded) == []
    other = {
        **recorded,
        "python": "3.0.0",
        "packages": {**recorded["packages"], "pytest": "0.1", "left-pad": "1.0"},
    }
    del other["packages"]["numpy"]
    lines = envlock.diff(recorded, other)
    assert lines[0] == f"python {recorded['python']} -> 3.0.0"
    assert f"packages changed (1): pytest {recorded['packages']['pytest']} -> 0.1" in lines
    assert "packages added (1): left-pad 1.0" in lines
    assert f"packages removed (1): numpy {recorded['packages']['numpy']}" in lines
