"""`stillroom regenerate`: the tables rebuilt from a results tree copied into a fresh clone, or
unpacked from a bundle, with no job but the tables'; an input that does not match its records is
refused by name."""

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from stillroom.review.bundle import write as write_bundle
from tests.conftest import REPO, as_built

slow = pytest.mark.slow
TABLE_RULES = {"tables", "budget_tables", "effort_tables", "kernel_tables", "teacher_tables"}
TEXT = (".md", ".csv", ".tex")


@pytest.fixture
def clone(done, tmp_path):
    """A fresh clone of the repository with the finished run's results copied in (new mtimes, no
    .snakemake)."""
    target = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(target)], check=True)
    shutil.copytree(as_built(done[0]) / "results", target / "results")
    return target


def regenerate(where: Path, *args: str) -> subprocess.CompletedProcess:
    """The README's command, run in ``where`` with this checkout's package."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "stillroom.cli", "regenerate", *args]
    return subprocess.run(cmd, cwd=where, env=env, capture_output=True, text=True, timeout=900)


def jobs(stdout: str) -> dict[str, int]:
    """Snakemake's "Job stats" table: jobs by rule."""
    block = stdout.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    rows = [re.match(r"(\S+)\s+(\d+)$", line.strip()) for line in block.splitlines()]
    return {m[1]: int(m[2]) for m in rows if m and m[1] != "total"}


def tables(exp: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (exp / "tables").iterdir() if p.suffix in TEXT}


def upstream_sidecars(results: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(results)): p.read_bytes()
        for p in results.rglob("*.prov.json")
        if "tables" not in p.parts
    }


@slow
def test_a_copied_run_regenerates_its_tables_with_no_upstream_job(done, clone):
    built = as_built(done[0]) / "results/small"
    before = upstream_sidecars(clone / "results")
    proc = regenerate(clone, "results/small")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = jobs(proc.stdout + proc.stderr)
    assert ran and set(ran) <= TABLE_RULES and "tables" in ran, ran
    assert tables(clone / "results/small") == tables(built)
    assert upstream_sidecars(clone / "results") == before  # nothing upstream was rebuilt
    assert re.search(r"verified the \d+ inputs of \d+ table jobs", proc.stdout)


@slow
def test_a_tampered_table_input_is_refused_by_name(clone):
    graded = clone / "results/small/eval/sft/heldout/graded.jsonl"
    records = [json.loads(line) for line in graded.read_text().splitlines()]
    line = next(i for i, r in enumerate(records) if not r["grade"]["correct"])
    records[line]["grade"]["correct"] = True
    graded.write_text("".join(json.dumps(r) + "\n" for r in records))
    table = clone / "results/small/tables/heldout.csv"
    written = table.stat().st_mtime_ns
    proc = regenerate(clone, "results/small")
    assert proc.returncode == 1
    assert (
        "stillroom regenerate: modified: results/small/eval/sft/heldout/graded.jsonl: recorded "
        in proc.stderr
    )
    assert f"record line {line + 1} (key {records[line]['key']})" in proc.stderr
    assert "refused" in proc.stderr and "Job stats" not in proc.stdout
    assert table.stat().st_mtime_ns == written


@slow
def test_an_unpacked_bundle_regenerates_its_tables(done, clone, tmp_path):
    archive, _ = write_bundle(clone / "results/small", tmp_path / "small-bundle.zip", report=False)
    with zipfile.ZipFile(archive) as z:
        z.extractall(tmp_path / "unpacked")
    top = tmp_path / "unpacked/small-bundle"
    proc = regenerate(tmp_path, str(top / "results/small"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert set(jobs(proc.stdout + proc.stderr)) <= TABLE_RULES
    assert tables(top / "results/small") == tables(as_built(done[0]) / "results/small")
