"""`stillroom audit`: from a table back to the raw teacher records, every file re-hashed.

The pipeline tests audit a copy of the real small run (other tests share the run, so nothing is
tampered with in place); the small tests build a three-file provenance chain by hand."""

import json
import shutil

import pytest

from stillroom.audit import audit, format_tree
from stillroom.cli import main
from stillroom.provenance import digest, now, sidecar_path, write_sidecars

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
