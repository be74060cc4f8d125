"""`stillroom audit`: from a table back to the raw teacher records, every file re-hashed.

The pipeline tests audit a copy of the real small run (other tests share the run, so nothing is
tampered with in place); the small tests build a three-file provenance chain by hand."""

import json
import shutil

import pytest

from stillroom import envlock
from stillroom.audit import audit, format_tree
from stillroom.cli import main
from stillroom.provenance import Job, digest, now, sidecar_path, write_sidecars

TABLE = "results/small/tables/heldout.md"
slow = pytest.mark.slow


@pytest.fixture
def run(done, tmp_path):
    """A private copy of the finished run; sidecar paths are relative to it."""
    workdir, _, _ = done
    shutil.copytree(workdir / "results", tmp_path / "run" / "results", symlinks=True)
    return tmp_path / "run"


def problems(report):
    return {(p.kind, p.path) for p in report.problems}


@slow
def test_a_clean_run_audits_clean_down_to_the_teacher_records(run):
    report = audit(run / TABLE)
    assert report.ok, format_tree(report)
    assert report.root == str(run)  # inferred from the table's sidecar
    nodes = report.nodes()
    assert any(
        n.path.startswith("results/small/gen/") and n.stage == "generate" and not n.repeat
        for n in nodes
    )
    stages = {n.stage for n in nodes}
    assert {
        "tables",
        "grade",
        "evaluate",
        "merge",
        "train",
        "dataset",
        "generate",
        "shard",
        "decontam",
        "pool",
        "base",
        "tokenizer",
        "select",
    } <= stages
    assert any(
        n.stage is None and n.path.endswith("tinybench.jsonl") for n in nodes
    )  # the source leaf
    text = format_tree(report)
    first = text.splitlines()[0]
    assert (
        first.startswith(TABLE) and "[tables]" in first and "config " in first and "git " in first
    )
    assert "torch " in first and "transformers " in first and "(see above)" in text


@slow
def test_a_moved_run_records_relative_paths_and_one_environment_lock(done, run):
    """The copy audits clean (above) because nothing in a sidecar points into the original working
    directory; every job references the run's one environment lock."""
    workdir = str(done[0])
    sidecars = list((run / "results").rglob("*.prov.json"))
    # (env: the job's environment as it was, not a path the audit follows)
    recorded = [json.dumps({**json.loads(s.read_text()), "env": None}) for s in sidecars]
    assert sidecars and not [s for s in recorded if workdir in s]
    (lock,) = (run / "results/small/env").iterdir()
    refs = {json.loads(s.read_text())["env_lock"]["path"] for s in sidecars}
    assert refs == {f"results/small/env/{lock.name}"}
    prov = json.loads(sidecar_path(run / TABLE).read_text())
    assert prov["config_path"].startswith("results/small/config/")
    assert audit(run / TABLE).notes == []  # audited in the environment it ran in


@slow
def test_a_tampered_sibling_of_the_table_is_named(run):
    """heldout.md's job also wrote heldout.png, .csv and .tex."""
    png = run / "results/small/tables/heldout.png"
    png.write_bytes(png.read_bytes() + b"\0")
    assert problems(audit(run / TABLE)) == {("modified", "results/small/tables/heldout.png")}


@slow
def test_an_edited_sidecar_upstream_of_the_table_is_named(run):
    """A field of a generation shard's sidecar rewritten: the graded shard built from it names the
    sidecar."""
    shard = min((run / "results/small/gen").rglob("shard-*.jsonl"))
    side = sidecar_path(shard)
    side.write_text(side.read_text().replace('"seed": 1234', '"seed": 1'))
    rel = str(side.relative_to(run))
    assert problems(audit(run / TABLE)) == {("modified", rel)}


@slow
def test_a_tampered_raw_shard_is_named(run, capsys):
    shard = min((run / "results/small/gen").rglob("shard-*.jsonl"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1  # one byte
    shard.write_bytes(bytes(data))
    rel = str(shard.relative_to(run))
    report = audit(TABLE, root=run)
    assert problems(report) == {
        ("modified", rel)
    }  # the consumer is not stale: it saw the recorded bytes

    assert main(["audit", TABLE, "--root", str(run)]) == 1
    err = capsys.readouterr().err
    assert f"modified: {rel}" in err


@slow
def test_a_replaced_checkpoint_file_is_named(run):
    ckpt = run / "results/small/ckpt"
    shutil.copy(ckpt / "base" / "model.safetensors", ckpt / "sft" / "model.safetensors")
    assert ("modified", "results/small/ckpt/sft/model.safetensors") in problems(audit(run / TABLE))
    assert problems(audit(ckpt / "sft")) == {
        ("modified", "results/small/ckpt/sft/model.safetensors")
    }


@slow
def test_a_table_built_from_since_rerun_inputs_is_stale(run):
    """A stage re-ran (its artifact and sidecar agree) but the table downstream did not."""
    graded = run / "results/small/eval/sft/heldout/graded.jsonl"
    graded.write_text("".join(graded.read_text().splitlines(keepends=True)[:-1]))
    prov = json.loads(sidecar_path(graded).read_text())
    sidecar_path(graded).write_text(json.dumps({**prov, **digest(graded)}))
    report = audit(run / TABLE)
    assert problems(report) == {("stale", TABLE)}
    assert report.problems[0].input == "results/small/eval/sft/heldout/graded.jsonl"
    assert "STALE" in format_tree(report).splitlines()[0]


@slow
def test_missing_sidecars_artifacts_and_config_snapshots_are_named(run, capsys):
    sidecar_path(run / "results/small/dataset/train.jsonl").unlink()
    (run / "results/small/pool/dev.jsonl").unlink()
    snapshot = next((run / "results/small/config").glob("*.json"))
    snapshot.write_text(snapshot.read_text().replace('"seed": 1234', '"seed": 1235'))
    found = problems(audit(run / TABLE))
    assert ("missing", "results/small/dataset/train.jsonl.prov.json") in found
    assert ("missing", "results/small/pool/dev.jsonl") in found
    assert ("modified", str(snapshot)) in found  # the moved tree's own snapshot, not the original's

    assert main(["audit", str(run / TABLE), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert not out["ok"] and {p["kind"] for p in out["problems"]} == {"missing", "modified"}


# --- a hand-built chain: source -> results/x/a.jsonl -> results/x/b.jsonl -------------------------


@pytest.fixture
def chain(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    (tmp_path / "results/x").mkdir(parents=True)
    (tmp_path / "src/raw.jsonl").write_text('{"prompt": "1+1"}\n')
    (tmp_path / "results/x/a.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    write_sidecars(
        {"a": "results/x/a.jsonl"},
        {"raw": "src/raw.jsonl"},
        stage="pool",
        params={"seed": 1},
        started=now(),
    )
    (tmp_path / "results/x/b.jsonl").write_text('{"accuracy": 1.0}\n')
    write_sidecars(
        {"b": "results/x/b.jsonl"},
        {"a": "results/x/a.jsonl"},
        stage="tables",
        params={"seed": 1},
        started=now(),
    )
    return tmp_path


def test_a_changed_source_file_makes_its_consumer_stale(chain):
    assert audit("results/x/b.jsonl").ok
    (chain / "src/raw.jsonl").write_text('{"prompt": "1+2"}\n')
    report = audit("results/x/b.jsonl")
    assert (
        problems(report) == {("stale", "results/x/a.jsonl")}
        and report.problems[0].input == "src/raw.jsonl"
    )


def test_an_artifact_without_provenance_and_an_unreadable_sidecar(chain):
    sidecar_path(chain / "results/x/b.jsonl").unlink()
    assert problems(audit("results/x/b.jsonl")) == {("no provenance", "results/x/b.jsonl")}
    sidecar_path(chain / "results/x/a.jsonl").write_text("{not json")
    assert problems(audit("results/x/a.jsonl")) == {("modified", "results/x/a.jsonl.prov.json")}


def test_an_edited_upstream_sidecar_is_named(chain):
    """The chain itself: a field of an input's sidecar edited after its consumer was built."""
    side = sidecar_path(chain / "results/x/a.jsonl")
    prov = json.loads(side.read_text())
    side.write_text(json.dumps({**prov, "params": {"seed": 2}}))
    report = audit("results/x/b.jsonl")
    assert problems(report) == {("modified", "results/x/a.jsonl.prov.json")}
    assert "differs from the sidecar results/x/b.jsonl was built with" in report.problems[0].detail


def test_a_tampered_sibling_output_is_named(chain):
    """Auditing one output of a job checks the others it wrote with it."""
    for name in ("t.md", "t.png"):
        (chain / "results/x" / name).write_text(name)
    write_sidecars(
        {"markdown": "results/x/t.md", "plot": "results/x/t.png"},
        {"b": "results/x/b.jsonl"},
        stage="tables",
        params={"seed": 1},
        started=now(),
    )
    assert audit("results/x/t.md").ok
    (chain / "results/x/t.png").write_text("forged")
    assert problems(audit("results/x/t.md")) == {("modified", "results/x/t.png")}
    (chain / "results/x/t.png").unlink()
    assert problems(audit("results/x/t.md")) == {("missing", "results/x/t.png")}


def test_the_environment_lock_is_checked_and_differences_are_noted(chain, monkeypatch):
    snapshot = chain / "results/x/config/c.json"
    snapshot.parent.mkdir()
    snapshot.write_text('{"seed": 1}')
    (chain / "results/x/c.md").write_text("c")
    write_sidecars(
        {"markdown": "results/x/c.md"},
        {"b": "results/x/b.jsonl"},
        stage="tables",
        params={"seed": 1},
        started=now(),
        job=Job(config_path=str(snapshot)),
    )
    lock_path = json.loads(sidecar_path(chain / "results/x/c.md").read_text())["env_lock"]["path"]
    report = audit("results/x/c.md")
    assert report.ok and report.notes == []
    recorded = json.loads((chain / lock_path).read_text())
    moved = {**recorded, "packages": {**recorded["packages"], "pytest": "0.0.1"}}
    monkeypatch.setattr(envlock, "current", lambda: moved)
    report = audit("results/x/c.md")
    assert report.ok  # a note, not a failure
    (note,) = report.notes
    assert note.startswith(f"environment differs from {lock_path}: packages changed (1): pytest ")
    assert f"note: {note}" in format_tree(report)
    (chain / lock_path).write_text(json.dumps({**recorded, "python": "2.7"}))
    assert problems(audit("results/x/c.md")) == {("modified", lock_path)}
