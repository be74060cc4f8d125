"""Tamperings a forger covers by rewriting every hash along the chain: only what ``audit
--recompute`` builds again from the inputs (a table, the dataset, a kernel grade), and what must
agree with a record nobody can rewrite alone (the config snapshot, a later job's sidecar), catches
them. The pipeline tests tamper with a private copy of the shared finished run."""

from pathlib import Path

import pytest

import stillroom
from stillroom.cli import main
from stillroom.io import iter_jsonl, read_json, write_json, write_jsonl
from stillroom.provenance.audit import audit, format_tree
from stillroom.provenance.sidecars import (
    digest,
    now,
    record_digests,
    sha256_file,
    sidecar_path,
    write_sidecars,
)
from stillroom.review.recompute import recompute_artifact

from ..conftest import kernel_records

TABLE = "results/small/tables/heldout.md"
DATASET = "results/small/dataset/train.jsonl"
slow = pytest.mark.slow


def forge(root, artifact):
    """A forger's whole job: ``artifact``'s sidecar (and its siblings') rewritten to its new bytes,
    then every sidecar that recorded it or a rewritten sidecar, up to the top of the chain."""
    todo = [artifact]
    while todo:
        rel = todo.pop()
        real = root / rel
        now_digest = digest(real)
        own = read_json(sidecar_path(real))
        jobs = [sidecar_path(root / p) for p in own.get("outputs", {}).values()]
        for side in jobs or [sidecar_path(real)]:  # the job's outputs each repeat the digests
            prov = read_json(side)
            if prov.get("artifact") == rel:
                prov.update(now_digest)
                if "record_sha256" in prov:
                    prov["record_sha256"] = record_digests(real)
            if prov.get("output_name") is not None and rel in prov.get("outputs", {}).values():
                name = next(n for n, p in prov["outputs"].items() if p == rel)
                prov["output_digests"][name] = now_digest["sha256"]
            if _rewrite(side, prov) and prov["artifact"] not in todo:
                todo.append(prov["artifact"])
        for side in sorted((root / "results").rglob("*.prov.json")):
            prov = read_json(side)
            for entry in (prov.get("inputs") or {}).values():
                for item in entry if isinstance(entry, list) else [entry]:
                    if item["path"] == rel:
                        item.update({k: v for k, v in now_digest.items() if k in item})
                        item["provenance_sha256"] = sha256_file(sidecar_path(real))
            if _rewrite(side, prov) and prov["artifact"] not in todo:
                todo.append(prov["artifact"])


def _rewrite(side, prov):
    """Write ``prov`` when it changed anything; whether it did."""
    if read_json(side) == prov:
        return False
    write_json(side, prov)
    return True


def differences(report):
    return [(d.file, d.row, d.column) for d in report.differences]


@slow
def test_a_dataset_row_edited_with_every_hash_forged_is_rebuilt_and_named(run, capsys):
    rows = list(iter_jsonl(run / DATASET))
    rows[3]["messages"][-1]["content"] = "a better answer, written by hand"
    write_jsonl(run / DATASET, rows)
    forge(run, DATASET)
    walk = audit(run / TABLE)
    assert walk.ok, format_tree(walk)  # the forged chain hashes clean: only a rebuild tells

    report = recompute_artifact(DATASET, run)
    edited = f"messages.{len(rows[3]['messages']) - 1}.content"
    assert differences(report) == [(DATASET, f"line 4 ({rows[3]['id']})", edited)]
    assert main(["audit", str(run / TABLE), "--recompute"]) == 1
    out = capsys.readouterr().out
    assert f"recompute {DATASET}" in out and f"line 4 ({rows[3]['id']}): {edited}" in out
    assert "written a better answer, written by hand" in out


@slow
def test_the_top_sidecars_metrics_edited_are_named(run, capsys):
    """The table's own sidecar (no later job hashed it) against the metrics the stage returns
    again; a checkpoint's, audited on its own, against the sidecar its merge was built with."""
    side = sidecar_path(run / TABLE)
    prov = read_json(side)
    model = next(iter(prov["metrics"]["accuracy"]))
    prov["metrics"]["accuracy"][model] = 0.99
    write_json(side, prov)
    assert audit(run / TABLE).ok  # nothing above it recorded the table's sidecar
    assert main(["audit", str(run / TABLE), "--recompute"]) == 1
    out = capsys.readouterr().out
    assert f"{TABLE}.prov.json: metrics: accuracy.{model}" in out

    ckpt = run / "results/small/ckpt/sft"
    prov = read_json(sidecar_path(ckpt))
    prov["metrics"]["final_loss"] = 0.01
    write_json(sidecar_path(ckpt), prov)
    found = {(p.kind, p.path) for p in audit(ckpt).problems}
    assert found == {("modified", "results/small/ckpt/sft.prov.json")}

    side = sidecar_path(run / DATASET)
    prov = read_json(side)
    prov["metrics"]["examples_correct"] += 1
    write_json(side, prov)
    forge(run, DATASET)  # its consumers' records of the sidecar rewritten too
    report = recompute_artifact(DATASET, run)
    assert differences(report) == [(f"{DATASET}.prov.json", "metrics", "examples_correct")]


@slow
def test_a_table_sidecars_seed_edited_is_named_by_audit_and_recompute(run, capsys):
    """Every job's seed is the config's: a sidecar claiming another one differs from the config
    snapshot it names, and a sibling's sidecar from the params the table was rebuilt with."""
    md, csv = sidecar_path(run / TABLE), sidecar_path(run / TABLE.replace(".md", ".csv"))
    prov = read_json(md)
    prov["seed"] = prov["params"]["seed"] = prov["seed"] + 1
    write_json(md, prov)
    found = {(p.kind, p.path) for p in audit(run / TABLE).problems}
    assert found == {("modified", f"{TABLE}.prov.json")}

    prov = read_json(csv)
    prov["seed"] += 1  # the field a reader sees, not the params the rebuild takes
    write_json(csv, prov)
    shown = str(csv.relative_to(run))
    assert main(["audit", str(run / TABLE.replace(".md", ".csv")), "--recompute"]) == 1
    out = capsys.readouterr().out
    assert f"{shown}: record: seed" in out


def test_a_kernel_grades_flipped_reward_with_its_hashes_forged_is_regraded(
    tmp_path, monkeypatch, capsys
):
    """A kernel grade built by the grade stage, its reward flipped and its sidecar rewritten to
    match: the regrade (no key file here, so the verdict is compared) names it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STILLROOM_KERNEL_KEY_FILE", raising=False)
    samples, graded = "results/k/samples.jsonl", "results/k/graded.jsonl"
    rows = [
        {**rec, "key": f"{rec['prompt_id']}/0", "response": "no code here", "kind": "kernel"}
        for rec in kernel_records(["relu"])
    ]
    write_jsonl(samples, rows)
    write_sidecars({"samples": samples}, {}, stage="evaluate", params={}, started=now())
    args = ["grade", "--samples", samples, "--out-graded", graded, "--params", "{}"]
    assert main(args) == 0
    assert recompute_artifact(graded).ok

    records = list(iter_jsonl(graded))
    records[0]["grade"]["correct"] = True
    records[0]["grade"]["status"] = "ok"
    records[0]["grade"]["details"]["reward"] = 1.0
    write_jsonl(graded, records)
    forge(tmp_path, graded)
    assert audit(graded).ok
    report = recompute_artifact(graded)
    assert "without the key" in report.note
    assert {d.column for d in report.differences if d.row == "line 1 (" + rows[0]["key"] + ")"} == {
        "grade.correct",
        "grade.status",
        "grade.details.reward",
    }
    assert main(["audit", graded, "--recompute"]) == 1
    assert "grade.details.reward" in capsys.readouterr().out


@slow
def test_the_ledgers_sidecar_names_no_checkout_and_still_estimates(done):
    """The ledger's params hold the config's local files relative to the repository, as
    configured: the run's records name no checkout, and the estimate still reads them."""
    workdir, _, _ = done
    checkout = str(Path(stillroom.__file__).resolve().parents[1])
    side = sidecar_path(workdir / "results/small/cost/ledger.csv")
    assert checkout not in side.read_text()
    assert read_json(side)["params"]["config"]["benchmarks"]["tinycode"] == (
        "config/benchmarks/tinycode.jsonl"
    )
    assert "est. GPU-hours" in (workdir / "results/small/cost/ledger.md").read_text()
