"""bench/chaos.py's comparison of two runs: what differs by design is counted, anything else is a
finding (the chaos run itself takes far longer than the suite allows)."""

import hashlib
import json


def run(root, records, *, commit="c0"):
    """A finished run's experiment folder: a shard, its sidecar, a log."""
    exp = root / "results" / "tiny"
    (exp / "gen").mkdir(parents=True)
    (exp / "logs").mkdir()
    shard = exp / "gen" / "shard.jsonl"
    shard.write_text("".join(json.dumps(r) + "\n" for r in records))
    digest = hashlib.sha256(shard.read_bytes()).hexdigest()
    side = {
        "artifact": str(shard),
        "sha256": digest,
        "bytes": shard.stat().st_size,
        "started_at": str(root),
        "git": {"commit": commit},
        "metrics": {"samples": len(records), "wall_s": len(str(root))},
    }
    (exp / "gen" / "shard.jsonl.prov.json").write_text(json.dumps(side))
    (exp / "logs" / "gen.log").write_text(f"attempt in {root}\n")
    return exp


def test_timestamps_and_latencies_differ_by_design(chaos, tmp_path):
    a = run(tmp_path / "a", [{"key": "k0", "response": "4", "created_at": "t1", "latency_s": 0.1}])
    b = run(tmp_path / "b", [{"key": "k0", "response": "4", "created_at": "t2", "latency_s": 0.25}])
    same, by_design, findings = chaos.compare(a, b)
    assert findings == []
    assert same == 1  # the sidecar: the shard itself differs by design
    assert by_design[".jsonl created_at"] == 1 and by_design[".jsonl latency_s"] == 1
    # the sidecar's digest and size are those of the shard, which differs only by design
    assert by_design["sidecar sha256"] == 1 and by_design["sidecar bytes"] == 1


def test_a_changed_record_is_a_finding(chaos, tmp_path):
    a = run(tmp_path / "a", [{"key": "k0", "response": "4", "created_at": "t1"}])
    b = run(tmp_path / "b", [{"key": "k0", "response": "5", "created_at": "t1"}])
    _, _, findings = chaos.compare(a, b)
    assert any(f.startswith("gen/shard.jsonl: 1 of 1 lines differ") for f in findings)
    assert any("shard.jsonl.prov.json: sha256" in f for f in findings)


def test_a_file_left_in_one_run_is_a_finding(chaos, tmp_path):
    a = run(tmp_path / "a", [{"key": "k0"}])
    b = run(tmp_path / "b", [{"key": "k0"}])
    (b / "gen" / "shard.jsonl.partial").write_text("{}\n")
    _, _, findings = chaos.compare(a, b)
    assert findings == ["only in the chaos run: gen/shard.jsonl.partial"]


def test_wall_time_columns_of_a_table_differ_by_design(chaos, tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("kind,name,jobs,gpu_hours\ngpu,train,1,0.08\n")
    b.write_text("kind,name,jobs,gpu_hours\ngpu,train,1,0.09\n")
    assert chaos.table_columns_differing(a, b) == {"gpu_hours"}
    b.write_text("kind,name,jobs,gpu_hours\ngpu,train,2,0.08\n")
    assert chaos.table_columns_differing(a, b) == {"jobs"}


def consumer(exp):
    """A table made from the shard: its sidecar holds the shard's digest and its sidecar's."""
    (exp / "tables").mkdir()
    table = exp / "tables" / "t.md"
    table.write_text("| model | accuracy |\n|---|---|\n| sft | 0.5 |\n")
    shard = exp / "gen" / "shard.jsonl"
    side = {
        "sha256": hashlib.sha256(table.read_bytes()).hexdigest(),
        "inputs": {
            "shard": {
                "sha256": hashlib.sha256(shard.read_bytes()).hexdigest(),
                "provenance_sha256": hashlib.sha256(
                    (exp / "gen" / "shard.jsonl.prov.json").read_bytes()
                ).hexdigest(),
            }
        },
    }
    (exp / "tables" / "t.md.prov.json").write_text(json.dumps(side))


def test_an_inputs_sidecar_digest_differs_by_design_when_the_sidecar_does(
    chaos, tmp_path, monkeypatch
):
    """Sidecars hold clock readings, so an input's sidecar digest differs between two runs; it is
    a finding only when that sidecar differs otherwise. Nested record keys count too."""
    rec = {"key": "k0", "grade": {"correct": True, "details": {"seconds": 0.1}}}
    a = run(tmp_path / "a", [rec])
    b = run(tmp_path / "b", [{**rec, "grade": {"correct": True, "details": {"seconds": 0.3}}}])
    consumer(a), consumer(b)
    same, by_design, findings = chaos.compare(a, b)
    assert findings == [] and same == 3
    assert by_design[".jsonl grade.details.seconds"] == 1
    assert by_design["sidecar inputs.shard.provenance_sha256"] == 1
    # a commit of other code: the shard's sidecar differs for real, and so its digest
    c = run(tmp_path / "c", [rec], commit="c1")
    consumer(c)
    monkeypatch.setattr(chaos, "same_workflow_code", lambda *_: False)
    _, _, findings = chaos.compare(a, c)
    assert "gen/shard.jsonl.prov.json: git.commit: 'c0' != 'c1'" in findings
    assert any(
        f.startswith("tables/t.md.prov.json: inputs.shard.provenance_sha256") for f in findings
    )
