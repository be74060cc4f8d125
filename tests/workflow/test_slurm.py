"""profiles/slurm against a real SLURM on this machine: slurmctld, two slurmd (virtual nodes sr1,
sr2 with stand-in GPUs) and slurmdbd, started by scripts/slurm-up.sh (.ci/run starts it; without it
these skip, except under CI=true, where they fail).

The small pipeline runs through `snakemake --profile profiles/slurm` unchanged but for faster status
polling, with training over 2 nodes: its job runs `srun` with one task per node, each starting
torchrun."""

import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ..conftest import REPO, Started, run_snakemake, small_config, start_snakemake, wait_snakemake
from .conftest import EARLY_NICE, started

ENV = {"SLURM_ACCOUNT": "root", "STILLROOM_CPU_PARTITION": "cpu", "STILLROOM_GPU_PARTITION": "gpu"}
# Real clusters want slow polling (the profile's); a test wants its answer.
FAST = (
    "--profile",
    str(REPO / "profiles" / "slurm"),
    "--slurm-init-seconds-before-status-checks",
    "2",
    "--seconds-between-status-checks",
    "2",
    "--max-status-checks-per-second",
    "10",
    "--latency-wait",
    "10",
)
# The procedural teacher needs no GPU, so its shards go to the CPU partition (stillroom/plan/dag.py
# partition_for).
GPU_RULES = {"train", "evaluate", "evaluate_budget", "evaluate_effort"}


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900)


def _cluster_problem() -> str | None:
    """Why the test cluster is not usable here, or None."""
    if shutil.which("sbatch") is None:
        return (
            "no SLURM here: scripts/slurm-up.sh starts the test cluster "
            "(root, Debian; .ci/run does)"
        )
    name = _run("scontrol", "show", "config")
    if "ClusterName             = stillroom" not in name.stdout:
        return "the test cluster of scripts/slurm-up.sh is not running (ClusterName stillroom)"
    if (
        sum(map(int, _run("sinfo", "-h", "-p", "gpu", "-o", "%D").stdout.split())) != 2
    ):  # per node state
        return "the test cluster's two nodes are not up: run scripts/slurm-up.sh"
    if _run("sacct", "-n", "-X", "-S", "now-1minute").returncode:
        return "sacct does not answer (slurmdbd down?): run scripts/slurm-up.sh"
    return None


@pytest.fixture(scope="module")
def cluster():
    problem = _cluster_problem()
    if problem and os.environ.get("CI"):
        pytest.fail(f"CI must run the SLURM tests: {problem}")
    if problem:
        pytest.skip(problem)


def sacct(job_ids, *fields, steps=False) -> list[dict]:
    cmd = ["sacct", "-n", "-P", "-j", ",".join(job_ids), "-o", ",".join(fields)]
    out = _run(*cmd, *([] if steps else ["-X"]))
    assert out.returncode == 0, out.stderr
    return [
        dict(zip(fields, line.split("|"), strict=False)) for line in out.stdout.splitlines() if line
    ]


def slurm_config() -> dict:
    cfg = small_config()
    cfg["experiment"] = "slurm"
    cfg["train"]["distributed"] = {"nodes": 2, "gpus_per_node": 1}
    return cfg


def start_slurm_run(workdir: Path) -> Started | None:
    """The run through the profile, started once these tests are collected (conftest.py)."""
    if _cluster_problem():
        return None  # the cluster fixture skips, or fails under CI
    polling = Path(__file__).with_name("slurm_fast_polling.py")
    return start_snakemake(workdir, slurm_config(), *FAST, env=ENV, script=polling, nice=EARLY_NICE)


pytestmark = [pytest.mark.slow, pytest.mark.early_run.with_args(start_slurm_run)]


@pytest.fixture(scope="module")
def slurm_run(cluster):
    workdir, run = started(start_slurm_run)
    cfg = slurm_config()
    proc = wait_snakemake(run)
    root = workdir / "results" / "slurm"
    sidecars = {
        str(p.relative_to(root)): json.loads(p.read_text()) for p in root.rglob("*.prov.json")
    }
    return workdir, cfg, proc, root, sidecars


def test_every_artifact_was_made_by_a_slurm_job_that_completed_on_the_right_partition(slurm_run):
    workdir, cfg, proc, root, sidecars = slurm_run
    for bench in cfg["eval"]["benchmarks"]:
        assert (root / "tables" / f"{bench}.md").exists()
    rules = {prov["rule"] for prov in sidecars.values()}
    assert {
        "pool",
        "generate",
        "grade_generation",
        "dataset",
        "train",
        "merge",
        "evaluate",
        "tables",
    } <= rules
    ids = {prov["slurm_job_id"] for prov in sidecars.values()}
    assert all(ids), [name for name, prov in sidecars.items() if not prov["slurm_job_id"]]
    jobs = {
        row["JobIDRaw"]: row
        for row in sacct(ids, "JobIDRaw", "JobID", "State", "Partition", "Account")
    }
    assert set(jobs) == ids
    for name, prov in sidecars.items():
        job = jobs[prov["slurm_job_id"]]
        assert job["State"] == "COMPLETED" and job["Account"] == "root", (name, job)
        assert job["Partition"] == ("gpu" if prov["rule"] in GPU_RULES else "cpu"), (name, job)


def test_training_job_ran_srun_with_one_task_per_node_each_starting_torchrun(slurm_run):
    workdir, cfg, proc, root, sidecars = slurm_run
    prov = sidecars["ckpt/sft.prov.json"]
    assert prov["metrics"]["world_size"] == 2
    rows = sacct(
        [prov["slurm_job_id"]],
        "JobID",
        "State",
        "NNodes",
        "NTasks",
        "AllocTRES",
        "NodeList",
        steps=True,
    )
    job, step = rows[0], next(r for r in rows if r["JobID"].endswith(".0"))
    assert (
        job["NNodes"] == "2" and "gres/gpu=2" in job["AllocTRES"] and job["NodeList"] == "sr[1-2]"
    )
    assert (step["NNodes"], step["NTasks"], step["State"]) == ("2", "2", "COMPLETED")
    log = (root / "logs" / "train.log").read_text()
    assert "srun --nodes=2 --ntasks-per-node=1" in log and "--rdzv-endpoint=sr1:" in log


def test_every_job_went_out_as_its_own_sbatch_under_the_profiles_name(slurm_run):
    """No arrays (profiles/slurm/profile.yaml): each job's SLURM id is its own, and its name carries
    the profile's prefix (squeue's %k shows the rule and wildcards, the plugin's comment)."""
    workdir, cfg, proc, root, sidecars = slurm_run
    ids = [p["slurm_job_id"] for p in sidecars.values() if p["rule"] in {"generate", "evaluate"}]
    rows = sacct(set(ids), "JobIDRaw", "JobID", "JobName")
    assert all("_" not in r["JobID"] for r in rows), rows
    assert all(r["JobName"].startswith("stillroom_") for r in rows), rows
    generate = {p["slurm_job_id"] for p in sidecars.values() if p["rule"] == "generate"}
    assert len(generate) == len(cfg["generation"]["efforts"]) * cfg["generation"]["shards"]


def test_cost_ledger_reads_gpu_time_from_sacct(slurm_run):
    workdir, cfg, proc, root, sidecars = slurm_run
    rows = {
        r["name"]: r
        for r in csv.DictReader((root / "cost" / "ledger.csv").open())
        if r["kind"] == "gpu"
    }
    assert rows["train"]["source"] == "sacct" and float(rows["train"]["gpu_hours"]) > 0
    assert rows["evaluate"]["source"] == "sacct" and float(rows["evaluate"]["gpu_hours"]) > 0


def test_a_second_run_through_the_profile_submits_nothing(slurm_run):
    workdir, cfg, *_ = slurm_run
    proc = run_snakemake(workdir, cfg, *FAST, env=ENV)
    assert "Nothing to be done" in proc.stdout + proc.stderr
