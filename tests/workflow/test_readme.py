"""The documented commands (README.md, docs/*.md), run verbatim as a new user runs them: in a copy
of the repository as a fresh clone has it, from a shell where the venv is not active. Every ```bash
block of those files is tied to the test that runs it (RUN_BY), so a block added or edited without
a working test fails."""

from __future__ import annotations

import json
import re
import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml

from stillroom.review.bundle import MANIFEST

from ..conftest import EARLY_NICE, REPO, Started, small_config, started, wait_snakemake
from ..readme import block, blocks, bundle_figures, repo_copy, script, start, user_env

# each documented block (README.md, docs/*.md), by its first command, and the tests that run it
RUN_BY = {
    "make run": ["tests/workflow/test_readme.py::start_first_contact"],
    "source .venv/bin/activate": ["tests/workflow/test_readme.py::start_first_contact"],
    "snakemake -n --configfile config/experiments/beam-distill.yaml": [
        "tests/workflow/test_readme.py::start_first_contact",
        "tests/workflow/test_readme.py::test_the_recipes_slurm_commands_stop_before_submitting",
    ],
    "stillroom stand-ins --configfile config/experiments/beam-distill-smoke.yaml": [
        "tests/workflow/test_experiments.py::start_twin",
    ],
    "stillroom estimate --configfile config/experiments/beam-distill.yaml": [
        "tests/workflow/test_readme.py::start_first_contact",
    ],
    "snakemake --cores 2 results/beam-qlora-mp-smoke/ckpt/sft": [
        "tests/workflow/test_readme.py::start_first_contact",
    ],
    # the SLURM block: its snakemake command on the test cluster (`stillroom plan`: test_slurm_plan)
    "snakemake --cores 2 --configfile config/experiments/autotriton-tiny.yaml": [
        "tests/workflow/test_experiments.py::test_autotriton_tiny_runs_end_to_end",
        "tests/workflow/test_readme.py::test_the_recipes_slurm_commands_stop_before_submitting",
    ],
    "snakemake --profile profiles/slurm": [
        "tests/workflow/test_readme.py::test_the_recipes_slurm_commands_stop_before_submitting",
    ],
    "make venv && source .venv/bin/activate": [
        "tests/workflow/test_readme.py::test_the_recipes_slurm_commands_stop_before_submitting",
        "tests/workflow/test_slurm.py::readme_slurm_command",
    ],
    "stillroom audit results/tiny/tables/heldout.md": [
        "tests/workflow/test_readme.py::start_first_contact",
    ],
}

MINE = "my-experiment"  # what `my.yaml` names: the small pipeline, as a user's own experiment


def test_every_readme_block_is_run_by_a_test():
    firsts = [b[0] for b in blocks() if b]
    unclaimed = [f for f in firsts if not any(f.startswith(p) for p in RUN_BY)]
    assert not unclaimed, f"documented blocks no test runs (add them to RUN_BY): {unclaimed}"
    for prefix, tests in RUN_BY.items():
        found = sum(f.startswith(prefix) for f in firsts)
        assert found == 1, f"README.md, docs/*.md: {found} blocks start with {prefix!r}, not 1"
        for node in tests:
            path, name = node.split("::")
            source = (REPO / path).read_text()
            assert f"def {name}(" in source, f"{node}: no such function"
            body = source[source.index(f"def {name}(") :]
            body = body[: body.find("\ndef ", 1) if "\ndef " in body[1:] else len(body)]
            assert f'block("{prefix}' in body, f"{node} does not run the block {prefix!r}"


def test_the_readme_blocks_are_read_as_a_shell_reads_them():
    text = "x\n```bash\nmake a  # why\nsnakemake --x a \\\n    b   # more\n\n```\n```\nnot\n```\n"
    assert blocks(text) == [["make a", "snakemake --x a b"]]


def start_first_contact(workdir: Path) -> Started:
    """A new user's first hour, from the documentation verbatim: `make run`, the DAG commands with
    their own experiment (`my.yaml`, the small pipeline), the bill, the recipe's DAG offline and a
    MoE fine-tune's smoke twin, in one shell in a copy of the repository."""
    copy = repo_copy(workdir)
    cfg = {**small_config(), "experiment": MINE}
    (copy / "my.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    dag_offline = block("snakemake -n --configfile config/experiments/beam-distill.yaml")[0]
    commands = [
        *block("make run")[:1],  # `make test` runs this test: .ci/run is checked to run it
        *block("source .venv/bin/activate"),
        *block("stillroom estimate --configfile config/experiments/beam-distill.yaml"),
        dag_offline,
        *block("snakemake --cores 2 results/beam-qlora-mp-smoke/ckpt/sft"),
        *block("stillroom audit results/tiny/tables/heldout.md"),  # after make run's tables
    ]
    return start(commands, copy, workdir, EARLY_NICE)


@pytest.mark.slow
@pytest.mark.early_run.with_args(start_first_contact)
def test_a_new_user_runs_the_readme_commands():
    workdir, run = started(start_first_contact)
    proc = wait_snakemake(run)
    log = proc.stdout + proc.stderr
    # make run: the default pipeline and its table printed
    assert "| base |" in proc.stdout and (workdir / "results/tiny/tables/heldout.md").exists()
    # `snakemake -n` after the complete run: nothing is stale
    after = log.split("$ snakemake -n\n", 1)[1].split("$ snakemake --cores all --configfile", 1)[0]
    assert "Nothing to be done" in after, after[-2000:]
    assert (workdir / "results" / MINE / "tables" / "heldout.md").exists()
    assert (workdir / "bill.json").exists()
    assert (workdir / "results/beam-qlora-mp-smoke/ckpt/sft.prov.json").exists()
    # the audit block: the cell tied to its counts, the regenerated tables, a bundle audited
    assert "cell: accuracy = " in proc.stdout and (workdir / "tiny-bundle.zip").exists()
    # the documented bundle figures (scripts/readme_bundle_figures.py) against this bundle
    mb, files, unpacked = readme_bundle_figures()
    with zipfile.ZipFile(workdir / "tiny-bundle.zip") as z:
        manifest = json.loads(z.read(next(n for n in z.namelist() if n.endswith(MANIFEST))))
    size_mb = (workdir / "tiny-bundle.zip").stat().st_size / 1e6
    assert len(manifest["files"]) == files, (len(manifest["files"]), files)
    measured_unpacked = sum(e["size"] for e in manifest["files"]) / 1e6
    assert abs(size_mb - mb) <= 0.1 * mb and abs(measured_unpacked - unpacked) <= 0.1 * unpacked, (
        f"{bundle_figures().DOC.name} says {mb} MB, {unpacked} MB unpacked; the run's bundle is "
        f"{size_mb:.2f} MB, "
        f"{measured_unpacked:.1f} MB unpacked: python scripts/readme_bundle_figures.py results/tiny"
    )


def readme_bundle_figures() -> tuple[float, int, float]:
    """The documented bundle figures without the report: zip MB, files, unpacked MB."""
    figures = bundle_figures()
    said = figures.readme_sentence(figures.DOC.read_text())
    mb, files, unpacked = re.findall(r"\d+(?:\.\d+)?", said)[:3]
    return float(mb), int(files), float(unpacked)


@pytest.mark.slurm
@pytest.mark.usefixtures("cluster")
def test_the_recipes_slurm_commands_stop_before_submitting(tmp_path):
    """The documented SLURM commands for the GPU recipes, verbatim, on the test cluster (2 stand-in
    GPUs a node): the set-up lines run, and each recipe is refused before its first sbatch with
    a line naming a rule's shape and what the partition has."""
    copy = repo_copy(tmp_path)
    setup = block("make venv && source .venv/bin/activate")
    recipes = [
        c
        for b in (
            setup,
            block("snakemake -n --configfile config/experiments/beam-distill.yaml"),
            block("snakemake --profile profiles/slurm"),
            block("snakemake --cores 2 --configfile config/experiments/autotriton-tiny.yaml"),
        )
        for c in b
        if c.startswith("snakemake --profile profiles/slurm")
    ]
    assert len(recipes) == 4, recipes  # beam-distill (twice), an overlay, autotriton-8b
    first = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    for recipe in dict.fromkeys(recipes):
        before = [c for c in setup if not c.startswith("snakemake ")]
        proc = subprocess.run(
            script(before + [recipe]), cwd=copy, env=user_env(), capture_output=True, text=True
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out[-3000:]
        assert re.search(r"rule \w+ asks .* partition \w+'s largest node", out), out[-3000:]
    after = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    assert set(after.split()) <= set(first.split()), "a recipe submitted a job"


def test_ci_runs_the_readme_test_command():
    # .ci/run: what the tests use from the host (as root), the README's test command verbatim, then
    # the SLURM tests that command skips
    (_, test), ci = block("make run"), (REPO / ".ci" / "run").read_text().splitlines()
    assert test == "make test" and ci[-3:] == ["make host", test, "make test-slurm"], ci[-3:]
