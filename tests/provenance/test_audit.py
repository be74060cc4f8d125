"""`stillroom audit`: from a table back to the raw teacher records, every file re-hashed.

The pipeline tests audit a copy of the real small run (other tests share the run, so nothing is
tampered with in place); the small tests build a three-file provenance chain by hand."""

import json
import re
import shutil

import numpy as np
import pytest

from stillroom.analysis.tables.schema import kind_of, load, write_csv
from stillroom.cli import STAGES, main
from stillroom.io import write_jsonl
from stillroom.provenance import envlock
from stillroom.provenance.audit import audit, format_tree
from stillroom.provenance.sidecars import Job, digest, now, sidecar_path, write_sidecars
from stillroom.review.recompute import TABLE_STAGES, recompute

TABLE = "results/small/tables/heldout.md"
slow = pytest.mark.slow


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
        "select_merge",
    } <= stages
    assert any(
        n.stage is None and n.path.endswith("tinybench.jsonl") for n in nodes
    )  # the source leaf
    text = format_tree(report)
    lines = text.splitlines()
    assert lines[0].startswith(f"audit of {TABLE}")
    recorded = lines[1]  # said once, not on every stage's line
    assert recorded.startswith("recorded: config ") and "git " in recorded
    assert "torch " in recorded and "transformers " in recorded
    assert lines[2].startswith(TABLE) and "[tables]" in lines[2] and "(see above)" in text


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
    assert "STALE" in format_tree(report).splitlines()[2]  # below the header and recorded line


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


@slow
def test_every_table_of_the_run_loads_round_trips_and_recomputes(run, tmp_path):
    tables = sorted((run / "results/small/tables").glob("*.csv"))
    kinds = set()
    for csv in tables:
        df = load(csv)
        kinds.add(kind_of(df.columns))
        write_csv(df, tmp_path / "again.csv")  # typed and back: the same bytes
        assert (tmp_path / "again.csv").read_bytes() == csv.read_bytes(), csv
        assert load(csv.with_suffix(".md")).equals(df)
        report = recompute(csv)
        assert report.ok, report.text()
    assert kinds == {"paired", "budgets", "efforts"}


@slow
def test_cell_walks_from_a_merge_to_the_training_rows_and_teacher_records(run, capsys):
    assert main(["audit", str(run / TABLE), "--cell", "merge-0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["cell"]
    row = load(run / TABLE).set_index("model").loc["merge-0.5"].iloc[0]
    assert len(out["records"]) == row["problems"] * row["samples"]
    assert out["verdicts"].get("correct", 0) == round(row["accuracy"] * len(out["records"]))
    assert [(c["path"], c["stage"]) for c in out["checkpoints"]] == [
        ("results/small/ckpt/merge-0.5", "merge"),
        ("results/small/ckpt/sft", "train"),
        ("results/small/ckpt/base", "base"),
    ]
    (ds,) = out["datasets"]
    lines = (run / ds["path"]).read_text().splitlines()
    assert ds["rows"] == len(lines) == len(ds["records"])
    assert sum(c["rows"] for c in ds["by_teacher_effort"]) == ds["rows"]
    assert {c["effort"] for c in ds["by_teacher_effort"]} == {"low", "medium"}
    assert all(r["verdict"] == "correct" for r in ds["records"])  # only correct traces train
    assert all(g.startswith("results/small/gen/") for r in ds["records"] for g in r["generated"])


@slow
def test_a_flipped_verdict_is_named_by_regrade_and_recompute(run, capsys):
    """A graded record edited by hand: the file's hash names the file, --regrade the record and
    --recompute the cells it moved."""
    graded = run / "results/small/eval/sft/heldout/graded.jsonl"
    assert main(["audit", str(run / TABLE), "--cell", "sft", "--regrade"]) == 0
    capsys.readouterr()
    records = [json.loads(line) for line in graded.read_text().splitlines()]
    flipped = next(r for r in records if r["grade"]["status"] == "ok" and not r["grade"]["correct"])
    flipped["grade"]["correct"] = True
    write_jsonl(graded, records)
    assert main(["audit", str(run / TABLE), "--cell", "sft", "--regrade", "--json"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert (
        "stillroom audit: verdict changed: results/small/eval/sft/heldout/graded.jsonl: "
        f"{flipped['key']}: recorded correct, regraded wrong"
    ) in err
    assert main(["audit", str(run / TABLE), "--recompute"]) == 1
    out, err = capsys.readouterr()
    assert "modified: results/small/eval/sft/heldout/graded.jsonl" in out
    cell = "results/small/tables/heldout.csv: model=sft reference=base: accuracy"
    # each cell once, as the CSV has it: its Markdown and LaTeX renderings are counted, not listed
    assert out.count(cell) == 1 and "heldout.md: sft" not in out
    assert "rendered cells differ with them:\n    results/small/tables/heldout.md: " in out
    assert err.startswith("stillroom audit: ") and err.endswith("problem(s), each named above\n")


@slow
def test_the_audit_tree_fits_a_terminal_and_has_a_legend(run):
    text = format_tree(audit(run / TABLE))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    assert "legend: PATH [stage: rule]" in text
    # said once on the recorded line, not on every stage's (git too, where a job's commit is the
    # run's: a commit made while the run ran shows on the lines of the jobs after it)
    assert sum("config " in line for line in lines) == 1
    assert sum("transformers " in line for line in lines) == 1


@slow
def test_cell_ties_its_counts_to_the_table_value(run, capsys):
    assert main(["audit", str(run / TABLE), "--cell", "merge-0.5"]) == 0
    out = capsys.readouterr().out
    row = load(run / TABLE).set_index("model").loc["merge-0.5"].iloc[0]
    n = int(row["problems"] * row["samples"])
    correct = round(row["accuracy"] * n)
    assert (
        f"cell: accuracy = {correct}/{n} = {correct / n:.3f} (correct / graded records; "
        f"the table says {row['accuracy']:.3f})"
    ) in out
    assert "ok: every file read above matches its sidecar" in out


@slow
def test_cell_fails_on_a_tampered_raw_teacher_record(run, capsys):
    """A teacher record behind sft's training rows, its boxed answer changed (as a forger would,
    a valid record): --cell names the shard, the line and the record's key."""
    assert main(["audit", str(run / TABLE), "--cell", "sft", "--json"]) == 0
    (ds,) = json.loads(capsys.readouterr().out)["cell"]["datasets"]
    shard = run / ds["records"][0]["generated"][0]
    lines = shard.read_text().splitlines()
    n, line = next((i, x) for i, x in enumerate(lines) if re.search(r"boxed\{\d+\}", x))
    lines[n] = re.sub(r"boxed\{(\d+)\}", lambda m: f"boxed{{{int(m[1]) + 2}}}", line, count=1)
    shard.write_text("\n".join(lines) + "\n")
    assert main(["audit", str(run / TABLE), "--cell", "sft"]) == 1
    out, err = capsys.readouterr()
    rel, key = str(shard.relative_to(run)), json.loads(line)["key"]
    assert f"!! 1 record file(s) do not match their provenance:\n  modified: {rel}\n" in out
    assert f"; record line {n + 1} (key {key}) changed" in out
    assert err == "stillroom audit: 1 problem(s), each named above\n"
    assert main(["audit", str(run / TABLE), "--cell", "sft", "--json"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["cell"]["ok"] is False
    assert f"stillroom audit: modified: {rel}: recorded " in err


@slow
def test_cell_fails_on_a_flipped_graded_verdict_and_names_the_count(run, capsys):
    graded = run / "results/small/eval/merge-0.5/heldout/graded.jsonl"
    records = [json.loads(line) for line in graded.read_text().splitlines()]
    i = next(
        i
        for i, r in enumerate(records)
        if r["grade"]["status"] == "ok" and not r["grade"]["correct"]
    )
    records[i]["grade"]["correct"] = True
    write_jsonl(graded, records)
    assert main(["audit", str(run / TABLE), "--cell", "merge-0.5", "--json"]) == 1
    err = capsys.readouterr().err
    assert (
        "modified: results/small/eval/merge-0.5/heldout/graded.jsonl: recorded " in err
        and f"record line {i + 1} (key {records[i]['key']}) changed" in err
    )
    row = load(run / TABLE).set_index("model").loc["merge-0.5"].iloc[0]
    n = int(row["problems"] * row["samples"])
    correct = round(row["accuracy"] * n)
    assert (
        f"differs: results/small/tables/heldout.csv: merge-0.5: the records give accuracy "
        f"{correct + 1}/{n}"
    ) in err


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


def test_the_audit_tree_ends_with_the_top_jobs_params_a_key_per_line(chain):
    side = sidecar_path(chain / "results/x/b.jsonl")
    prov = json.loads(side.read_text())
    side.write_text(json.dumps({**prov, "params": {"seed": 1, "n_resamples": 500, "sets": ["a"]}}))
    lines = format_tree(audit("results/x/b.jsonl")).splitlines()
    at = lines.index("params of results/x/b.jsonl:")
    assert lines[at + 1 : at + 5] == ["  n_resamples: 500", "  seed: 1", "  sets:", "  - a"]


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


# --- a table's numbers against its graded records: --recompute and --cell ------------------------

MODELS = {"base": 0.1, "sft": 0.6, "merge-0.5": 0.5}
PAIRED = {
    "benchmark": "heldout",
    "base": "base",
    "tuned": "sft",
    "n_resamples": 500,
    "confidence": 0.95,
    "seed": 3,
}


@pytest.fixture
def built(tmp_path, monkeypatch):
    """A paired table built through the CLI, as the rule builds it, from three graded files (each
    with a sidecar, so the provenance walk is clean)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results/x/eval").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name, p in MODELS.items():
        path = f"results/x/eval/{name}.jsonl"
        write_jsonl(
            path,
            [
                {
                    "key": f"p{i:02d}/{name}/{s}",
                    "prompt_id": f"p{i:02d}",
                    "sample_index": s,
                    "completion_tokens": int(rng.integers(5, 40)),
                    "grade": {"correct": bool(rng.random() < p), "status": "ok"},
                    "grader": {"name": "choice", "version": "0.1.0"},
                }
                for i in range(30)
                for s in range(2)
            ],
        )
        write_sidecars({"graded": path}, {}, stage="grade", params={}, started=now())
    out = {k: f"results/x/tables/heldout.{k}" for k in ("md", "csv", "tex", "png", "html")}
    args = ["tables", "--graded", *(f"{n}=results/x/eval/{n}.jsonl" for n in MODELS)]
    args += ["--out-markdown", out["md"], "--out-csv", out["csv"], "--out-latex", out["tex"]]
    args += ["--out-plot", out["png"], "--out-html", out["html"]]
    assert main([*args, "--params", json.dumps(PAIRED)]) == 0
    return tmp_path


def _rewrite_hash(path):
    """A forger's last step: the artifact's own sidecar made to match its new bytes."""
    prov = json.loads(sidecar_path(path).read_text())
    sidecar_path(path).write_text(json.dumps({**prov, **digest(path)}))


def test_recompute_passes_an_untouched_table(built, capsys):
    report = recompute("results/x/tables/heldout.md")
    assert report.ok and report.params["seed"] == 3 and report.params["n_resamples"] == 500
    assert sorted(report.compared) == [
        f"results/x/tables/heldout.{k}" for k in ("csv", "html", "md", "tex")
    ]
    assert main(["audit", "results/x/tables/heldout.csv", "--recompute"]) == 0
    assert "match the graded records" in capsys.readouterr().out


def test_a_forged_csv_cell_with_a_matching_hash_is_named_by_model_and_column(built, capsys):
    csv = built / "results/x/tables/heldout.csv"
    df = load(csv)
    row = df.index[(df["model"] == "merge-0.5") & (df["reference"] == "base")][0]
    df.loc[row, "ci_high"] = df.loc[row, "ci_high"] + 0.01
    write_csv(df, csv)
    _rewrite_hash(csv)
    assert audit(csv).ok  # the hashes alone say nothing is wrong
    assert main(["audit", str(csv), "--recompute", "--json"]) == 1
    err = capsys.readouterr().err
    assert (
        "differs: results/x/tables/heldout.csv: model=merge-0.5 reference=base: ci_high: written "
        in err
    )
    assert err.count("differs:") == 1
    assert main(["audit", str(csv), "--recompute"]) == 1
    out, err = capsys.readouterr()
    assert out.count("results/x/tables/heldout.csv: model=merge-0.5 reference=base: ci_high") == 1
    assert err == "stillroom audit: 1 problem(s), each named above\n"


def test_a_forged_markdown_cell_is_named_by_its_row_and_header(built):
    md = built / "results/x/tables/heldout.md"
    lines = md.read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("| sft |"))
    cells = lines[i].split(" | ")
    assert cells[1] == f"{load(md)['accuracy'][2]:.3f}"
    cells[1] = "0.999"
    lines[i] = " | ".join(cells)
    md.write_text("\n".join(lines) + "\n")
    _rewrite_hash(md)
    assert audit(md).ok
    report = recompute(md)
    assert [(d.file, d.row, d.column, d.written) for d in report.differences] == [
        ("results/x/tables/heldout.md", "sft", "accuracy", "0.999")
    ]


def test_a_changed_seed_in_the_sidecar_is_a_changed_table(built):
    """The recorded params are what the recompute uses: a sidecar claiming another seed than the
    one the numbers were drawn with does not pass."""
    csv = built / "results/x/tables/heldout.csv"
    prov = json.loads(sidecar_path(csv).read_text())
    prov["params"]["seed"] = 4
    sidecar_path(csv).write_text(json.dumps(prov))
    diffs = recompute(csv).differences
    columns = {d.column for d in diffs if d.file.endswith(".csv")}
    intervals = {"ci_low", "ci_high", "p_value", "p_holm", "tokens_ci_low", "tokens_ci_high"}
    assert columns and columns <= intervals  # the accuracies themselves do not depend on it


def test_cell_lists_the_graded_records_of_one_model(built, capsys):
    assert main(["audit", "results/x/tables/heldout", "--cell", "merge-0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["cell"]
    assert len(out["records"]) == 60 and out["graders"] == {"choice 0.1.0": 60}
    assert {r["file"] for r in out["records"]} == {"results/x/eval/merge-0.5.jsonl"}
    accuracy = load("results/x/tables/heldout.csv").set_index("model")["accuracy"]["merge-0.5"]
    assert out["verdicts"]["correct"] == round(accuracy.iloc[0] * 60)


def test_bad_arguments_get_a_clear_error(built, capsys):
    assert main(["audit", "results/x/tables/heldout.md", "--cell", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no model 'nope' in this table; it has base, sft, merge-0.5" in err
    assert main(["audit", "results/x/eval/sft.jsonl", "--recompute"]) == 2
    assert "results/x/eval/sft.jsonl: not a table" in capsys.readouterr().err
    assert main(["audit", "results/x/tables/heldout.md", "--regrade"]) == 2
    assert "give --cell MODEL" in capsys.readouterr().err


def test_recompute_calls_the_functions_the_cli_runs():
    from stillroom.stages import tables

    for name, func in TABLE_STAGES.items():
        assert STAGES[name].function is getattr(tables, func)
