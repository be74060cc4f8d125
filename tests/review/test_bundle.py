"""`stillroom bundle` and `stillroom audit --bundle`: a table's evidence in one archive, checked
where the raw data is not.

A small experiment is built by hand, as the rules build it (graded files with sidecars, the paired
table through the CLI, a config snapshot and an environment lock); no pipeline runs."""

import hashlib
import io
import json
import shutil
import zipfile

import numpy as np
import pandas as pd
import pytest

from stillroom.analysis.tables.schema import write_csv
from stillroom.cli import main
from stillroom.config import config_hash
from stillroom.io import write_json, write_jsonl
from stillroom.provenance.sidecars import Job, now, write_sidecars
from stillroom.review import bundle
from stillroom.review.bundle import MANIFEST, TRANSCRIPT, audit_bundle

MODELS = {"base": 0.1, "sft": 0.6, "merge-0.5": 0.5}
PAIRED = {
    "benchmark": "heldout",
    "base": "base",
    "tuned": "sft",
    "n_resamples": 300,
    "confidence": 0.95,
    "seed": 3,
}
TABLE = "results/x/tables/heldout"


@pytest.fixture
def experiment(tmp_path, monkeypatch):
    """results/x: three models' samples and graded records, the paired table built from them."""
    monkeypatch.chdir(tmp_path)
    config = {"experiment": "x", "seed": 3}
    snapshot = f"results/x/config/{config_hash(config)[:16]}.json"
    write_json(snapshot, config)
    job = Job(config_path=snapshot)
    rng = np.random.default_rng(0)
    for name, p in MODELS.items():
        samples, graded = (
            f"results/x/eval/{name}/samples.jsonl",
            f"results/x/eval/{name}/graded.jsonl",
        )
        rows = [
            {
                "key": f"p{i:02d}/{name}/{s}",
                "prompt_id": f"p{i:02d}",
                "sample_index": s,
                "completion_tokens": int(rng.integers(5, 40)),
            }
            for i in range(20)
            for s in range(2)
        ]
        write_jsonl(samples, rows)
        write_sidecars(
            {"samples": samples}, {}, stage="evaluate", params={}, started=now(), job=job
        )
        write_jsonl(
            graded,
            [
                {
                    **r,
                    "grade": {"correct": bool(rng.random() < p), "status": "ok"},
                    "grader": {"name": "choice", "version": "0.1.0"},
                }
                for r in rows
            ],
        )
        write_sidecars(
            {"graded": graded},
            {"samples": samples},
            stage="grade",
            params={},
            started=now(),
            job=job,
        )
    args = ["tables", "--graded", *(f"{n}=results/x/eval/{n}/graded.jsonl" for n in MODELS)]
    outputs = (
        ("markdown", "md"),
        ("csv", "csv"),
        ("latex", "tex"),
        ("plot", "png"),
        ("html", "html"),
    )
    for out, ext in outputs:
        args += [f"--out-{out}", f"{TABLE}.{ext}"]
    assert main([*args, "--params", json.dumps(PAIRED), "--config", snapshot]) == 0
    return tmp_path


@pytest.fixture
def archive(experiment):
    """The experiment's bundle, the run itself then removed: the reviewer has only the archive."""
    out = experiment / "review" / "x-bundle.zip"
    assert main(["bundle", "results/x", "--out", str(out), "--no-report"]) == 0
    shutil.rmtree(experiment / "results")
    return out


def members(path):
    with zipfile.ZipFile(path) as z:
        return {n.split("/", 1)[1]: z.read(n) for n in z.namelist()}


def rewrite(path, files, reseal=()):
    """Write the archive again with ``files``; the manifest's entries of ``reseal`` made to match
    their new bytes (a forger's last step)."""
    manifest = json.loads(files[MANIFEST])
    for e in manifest["files"]:
        if e["path"] in reseal:
            e["sha256"] = hashlib.sha256(files[e["path"]]).hexdigest()
            e["size"] = len(files[e["path"]])
    files = {**files, MANIFEST: json.dumps(manifest).encode()}
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(f"x-bundle/{name}", data)


def problems(report):
    return {(p.kind, p.path) for p in report.problems}


def test_a_bundle_holds_the_evidence_and_audits_clean_without_the_run(archive, capsys):
    files = members(archive)
    manifest = json.loads(files[MANIFEST])
    kinds = {e["path"]: e["kind"] for e in manifest["files"]}
    assert set(kinds) == set(files) - {MANIFEST}
    for ext in ("md", "csv", "tex"):
        assert kinds[f"{TABLE}.{ext}"] == "table"
        assert kinds[f"{TABLE}.{ext}.prov.json"] == "sidecar"
    assert kinds[f"{TABLE}.png"] == "plot"
    for name in MODELS:
        assert kinds[f"results/x/eval/{name}/graded.jsonl"] == "graded records"
        # the samples' record is kept, not the samples
        assert kinds[f"results/x/eval/{name}/samples.jsonl.prov.json"] == "sidecar"
        assert f"results/x/eval/{name}/samples.jsonl" not in kinds
    assert {k for p, k in kinds.items() if "/config/" in p or "/env/" in p} == {
        "config snapshot",
        "environment lock",
    }
    assert kinds[TRANSCRIPT] == "audit transcript"
    assert manifest["report"] == {"included": False, "reason": "not made (--no-report)"}
    assert manifest["audit"] == {"ok": True, "problems": []}
    for e in manifest["files"]:
        assert e["sha256"] == hashlib.sha256(files[e["path"]]).hexdigest()
        assert e["size"] == len(files[e["path"]])
    transcript = files[TRANSCRIPT].decode()
    assert f"$ stillroom audit {TABLE}.csv\naudit of {TABLE}.csv\n" in transcript
    assert f"\n{TABLE}.csv  [tables]" in transcript
    assert f"$ stillroom audit {TABLE}.csv --recompute\nrecompute" in transcript
    assert "seed 3, 300 resamples\nok: " in transcript

    report = audit_bundle(archive)
    assert report.ok, report.text()
    (rec,) = report.recomputed
    assert rec.ok and sorted(rec.compared) == [f"{TABLE}.{e}" for e in ("csv", "html", "md", "tex")]
    assert report.checked["config"] == 1 and report.checked["lock"] == 1
    assert set(report.not_in_bundle) == {f"results/x/eval/{n}/samples.jsonl" for n in MODELS}
    assert main(["audit", "--bundle", str(archive)]) == 0
    out = capsys.readouterr().out
    assert "not in bundle (by design): 3 recorded inputs" in out and "\nok: every file" in out


def test_a_forged_cell_with_every_hash_rewritten_is_caught_by_the_recompute(archive, capsys):
    files = members(archive)
    df = pd.read_csv(io.BytesIO(files[f"{TABLE}.csv"]))
    row = df.index[(df["model"] == "merge-0.5") & (df["reference"] == "base")][0]
    df.loc[row, "ci_high"] += 0.01
    forged = archive.parent / "forged.csv"
    write_csv(df, forged)
    files[f"{TABLE}.csv"] = forged.read_bytes()
    sha = hashlib.sha256(files[f"{TABLE}.csv"]).hexdigest()
    # the table's own sidecar and its siblings' record of it, all made to match
    for ext in ("md", "csv", "tex", "png", "html"):
        prov = json.loads(files[f"{TABLE}.{ext}.prov.json"])
        prov["output_digests"]["csv"] = sha
        if ext == "csv":
            prov["sha256"] = sha
        files[f"{TABLE}.{ext}.prov.json"] = json.dumps(prov).encode()
    rewrite(
        archive,
        files,
        reseal=[
            f"{TABLE}.{e}"
            for e in ("csv", "csv.prov.json", "md.prov.json", "tex.prov.json", "png.prov.json")
            + ("html.prov.json",)
        ],
    )
    report = audit_bundle(archive)
    assert problems(report) == {("differs", f"{TABLE}.csv")}
    (p,) = report.problems
    assert p.detail.startswith("model=merge-0.5 reference=base: ci_high: written ")
    assert main(["audit", "--bundle", str(archive)]) == 1
    assert (
        f"stillroom audit: differs: {TABLE}.csv: model=merge-0.5 reference=base: ci_high"
        in capsys.readouterr().err
    )


def test_a_graded_file_missing_from_the_archive_is_named_and_stops_the_recompute(archive):
    files = members(archive)
    del files["results/x/eval/sft/graded.jsonl"]
    rewrite(archive, files)
    report = audit_bundle(archive)
    assert problems(report) == {
        ("missing", "results/x/eval/sft/graded.jsonl"),
        ("not recomputable", f"{TABLE}.csv"),
    }
    detail = {p.kind: p.detail for p in report.problems}
    assert detail["missing"] == "listed in the manifest, not in the archive"
    assert (
        "its input results/x/eval/sft/graded.jsonl is not in the bundle"
        in detail["not recomputable"]
    )


def test_bytes_that_differ_from_the_manifest_are_named(archive):
    files = members(archive)
    graded = "results/x/eval/base/graded.jsonl"
    lines = files[graded].decode().splitlines()
    record = json.loads(lines[0])
    record["grade"]["correct"] = not record["grade"]["correct"]
    lines[0] = json.dumps(record)
    files[graded] = ("\n".join(lines) + "\n").encode()
    files["results/x/notes.txt"] = b"added after the fact"
    rewrite(archive, files)
    report = audit_bundle(archive)
    found = problems(report)
    assert {("modified", graded), ("unlisted", "results/x/notes.txt")} <= found
    details = [p.detail for p in report.problems if p.path == graded]
    assert details[0].startswith("manifest says ")
    assert any(d.startswith("its sidecar records ") for d in details)
    assert any(d.startswith(f"{TABLE}.") and "was built from it at " in d for d in details)
    # the flipped verdict changes the base's accuracy: the recompute names the cell too
    assert ("differs", f"{TABLE}.csv") in found

    # manifest and the graded file's own sidecar resealed: the table's record of its input and the
    # recompute still catch it
    files = members(archive)
    del files["results/x/notes.txt"]
    prov = json.loads(files[f"{graded}.prov.json"])
    prov["sha256"] = hashlib.sha256(files[graded]).hexdigest()
    files[f"{graded}.prov.json"] = json.dumps(prov).encode()
    rewrite(archive, files, reseal=[graded, f"{graded}.prov.json"])
    report = audit_bundle(archive)
    assert ("modified", graded) in problems(report)
    assert ("differs", f"{TABLE}.csv") in problems(report)
    assert all(not p.detail.startswith("manifest says") for p in report.problems)


def test_the_manifest_says_why_there_is_no_report(experiment, monkeypatch):
    monkeypatch.setattr(bundle, "SNAKEFILE", experiment / "no" / "Snakefile")
    path, manifest = bundle.write("results/x", experiment / "x.zip")
    assert manifest["report"]["included"] is False
    assert manifest["report"]["reason"].startswith(f"no workflow at {experiment}/no/Snakefile")
    assert bundle.REPORT not in members(path)


def test_bad_arguments_get_a_clear_error(experiment, capsys):
    assert main(["bundle", "results/x/eval", "--no-report"]) == 2
    assert (
        "results/x/eval: not an experiment directory (no table sidecars" in capsys.readouterr().err
    )
    assert main(["bundle", "results/y"]) == 2
    assert "results/y: not a directory" in capsys.readouterr().err
    assert main(["bundle", "results/x", "--out", "x.tar.gz"]) == 2
    assert "x.tar.gz: a bundle is a zip archive" in capsys.readouterr().err
    assert main(["bundle", "results/x", "--out", "results/x/b.zip"]) == 2
    assert "inside the experiment it bundles" in capsys.readouterr().err

    assert main(["audit", "--bundle", f"{TABLE}.csv"]) == 2
    assert f"{TABLE}.csv: not a bundle: not a zip archive" in capsys.readouterr().err
    with zipfile.ZipFile(experiment / "plain.zip", "w") as z:
        z.writestr("plain/readme.txt", "hello")
    assert main(["audit", "--bundle", "plain.zip"]) == 2
    assert "plain.zip: not a bundle: no MANIFEST.json" in capsys.readouterr().err
    with zipfile.ZipFile(experiment / "escape.zip", "w") as z:
        z.writestr("b/MANIFEST.json", json.dumps({"schema": bundle.SCHEMA, "files": []}))
        z.writestr("b/../../evil.txt", "x")
    assert main(["audit", "--bundle", "escape.zip"]) == 2
    assert "member b/../../evil.txt would land outside" in capsys.readouterr().err
    assert main(["audit", "--bundle", "nothing.zip"]) == 2
    assert "nothing.zip: no such file" in capsys.readouterr().err
    assert main(["audit", f"{TABLE}.md", "--bundle", "plain.zip"]) == 2
    assert "--bundle checks an archive on its own" in capsys.readouterr().err
    assert main(["audit"]) == 2
    assert "give an artifact to audit, or --bundle ARCHIVE" in capsys.readouterr().err


TOY_SNAKEFILE = """
rule table:
    output:
        report("results/x/tables/heldout.csv", category=config["experiment"] + " tables"),
    shell:
        "exit 1"
"""


@pytest.mark.slow
def test_the_snakemake_report_of_the_experiments_config_is_bundled(experiment, monkeypatch):
    """The report is made by Snakemake in the run's directory with the config snapshot the tables
    name (a one-rule workflow stands in for the project's, which would take a pipeline's time)."""
    (experiment / "wf").mkdir()
    (experiment / "wf/Snakefile").write_text(TOY_SNAKEFILE)
    monkeypatch.setattr(bundle, "SNAKEFILE", experiment / "wf/Snakefile")
    path, manifest = bundle.write("results/x", experiment / "x.zip")
    assert manifest["report"]["included"] is True, manifest["report"]
    assert "--configfile " + str(experiment / "results/x/config") in manifest["report"]["command"]
    html = members(path)[bundle.REPORT].decode()
    assert "heldout.csv" in html and "x tables" in html
    assert {"path": bundle.REPORT, "kind": "snakemake report"}.items() <= next(
        e for e in manifest["files"] if e["path"] == bundle.REPORT
    ).items()
    assert audit_bundle(path).ok


def test_an_edited_sidecar_of_a_left_out_artifact_is_named(archive):
    """The samples are not bundled, but their sidecar is, and the graded file's sidecar recorded
    its hash: the chain of records is checked without the data."""
    files = members(archive)
    side = "results/x/eval/sft/samples.jsonl.prov.json"
    prov = json.loads(files[side])
    prov["params"] = {"temperature": 0.0}
    files[side] = json.dumps(prov).encode()
    rewrite(archive, files, reseal=[side])
    report = audit_bundle(archive)
    assert problems(report) == {("modified", side)}
    assert report.problems[0].detail.startswith(
        "differs from the sidecar results/x/eval/sft/graded.jsonl was built with"
    )


def test_a_sidecar_naming_files_outside_the_bundle_never_reads_them(archive):
    """A forged sidecar pointing at the reviewer's own files: listed as not in the bundle, never
    hashed (a hash that differs would be a problem)."""
    outside = archive.parent / "outside.txt"
    outside.write_text("the reviewer's file")
    files = members(archive)
    side = "results/x/eval/sft/graded.jsonl.prov.json"
    prov = json.loads(files[side])
    zeros = "0" * 64
    prov["inputs"]["extra"] = {
        "path": str(outside),
        "sha256": zeros,
        "provenance": str(outside),
        "provenance_sha256": zeros,
    }
    prov["env_lock"]["path"] = "../../" + prov["env_lock"]["path"]
    files[side] = json.dumps(prov).encode()
    rewrite(archive, files, reseal=[side])
    report = audit_bundle(archive)
    # the edit itself is seen by the table that recorded this sidecar, nothing else
    assert problems(report) == {("modified", side)}
    assert report.not_in_bundle[str(outside)] == "results/x/eval/sft/graded.jsonl"
    assert report.checked["lock"] == 1  # the climbing lock path is the bundle's own lock


def test_bytes_changed_inside_the_archive_itself_are_named(archive):
    """A member whose bytes were edited in place no longer matches its CRC: named, not used."""
    files = members(archive)
    rewrite(archive, files)  # stored uncompressed, so the member's bytes can be found
    raw = archive.read_bytes()
    at = raw.index(files[f"{TABLE}.md"]) + files[f"{TABLE}.md"].index(b"| sft |") + 2
    archive.write_bytes(raw[:at] + b"S" + raw[at + 1 :])
    report = audit_bundle(archive)
    damaged = [p for p in report.problems if p.path == f"{TABLE}.md"]
    assert damaged[0].kind == "modified"
    assert damaged[0].detail.startswith("unreadable in the archive: Bad CRC-32")
    assert ("missing", f"{TABLE}.md") not in problems(report)
    assert f"{TABLE}.md" not in report.not_in_bundle  # listed, so not left out by design


@pytest.mark.slow
def test_the_bundle_of_a_run_holds_the_dev_records_of_its_merge_choice(done, tmp_path, capsys):
    """ "chosen on dev" can be checked from the bundle alone: the choice's graded dev records are
    in it, and `audit --bundle` decides the choice again from them."""
    from tests.conftest import as_built

    exp = as_built(done[0]) / "results/small"
    path, manifest = bundle.write(exp, tmp_path / "small.zip", report=False)
    (choice,) = exp.rglob("selected.json")
    prov = json.loads((choice.parent / "selected.json.prov.json").read_text())
    dev = {e["path"] for e in prov["inputs"]["graded"]}
    kinds = {e["path"]: e["kind"] for e in manifest["files"]}
    assert dev and all(kinds.get(p) == "dev records" for p in dev), kinds
    assert main(["audit", "--bundle", str(path)]) == 0
    out = capsys.readouterr().out
    chosen = json.loads(choice.read_text())["selected"]
    assert f"merge choice {choice.relative_to(exp.parent.parent)}\n  {chosen} chosen on " in out


def test_the_readme_bundle_figures_are_the_scripts_sentence():
    """The documented figures (docs/provenance.md) are written by scripts/readme_bundle_figures.py
    from a real run, in its words (a hand-typed figure elsewhere in the sentence fails here)."""
    from tests.readme import bundle_figures

    figures = bundle_figures()
    said = figures.readme_sentence(figures.DOC.read_text())
    assert figures.FIGURES.match(said), said
    numbers = {"plain_mb": 0.5, "plain_files": 3, "plain_unpacked_mb": 1.0}
    written = figures.sentence({**numbers, "report_mb": 1.25, "report_files": 4})
    assert figures.FIGURES.match(written), written
