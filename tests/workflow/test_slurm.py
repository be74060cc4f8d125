"""profiles/slurm against a real SLURM on this machine: slurmctld, two slurmd (virtual nodes sr1,
sr2 with stand-in GPUs) and slurmdbd, started by scripts/slurm-up.sh (`make host`). Run by `make
test-slurm` (.ci/run); without the cluster they skip, except under CI=true, where they fail.

One run of the suite goes through SLURM: the SLURM command, taken from docs/slurm.md's text,
with the small config and faster status polling, nothing else: no --cores (threads are capped at the
largest node's CPUs), training over 2 nodes (its job runs `srun` with one task per node, each
starting torchrun), and one evaluation job requeued while it runs by a monitor started with the run
(the profile submits without arrays: docs/slurm.md, profiles/slurm/profile.yaml)."""

import csv
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from stillroom.workflow import snakemake_env

from ..conftest import REPO, Started, run_snakemake, small_config, wait_snakemake
from ..readme import block
from ..test_harmless_logs import harmless_lines
from .conftest import run_tool

ENV = {"SLURM_ACCOUNT": "root", "STILLROOM_CPU_PARTITION": "cpu", "STILLROOM_GPU_PARTITION": "gpu"}
# Real clusters want slow polling (the profile's); a test wants its answer: the plugin's own
# options, its back-off unpatched (10 s more after each round in which no job ended), which ran
# the SLURM test faster than a fixed short poll on a shared machine.
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


def sacct(job_ids, *fields, steps=False) -> list[dict]:
    cmd = ["sacct", "-n", "-P", "-j", ",".join(job_ids), "-o", ",".join(fields)]
    out = run_tool(*cmd, *([] if steps else ["-X"]))
    assert out.returncode == 0, out.stderr
    return [
        dict(zip(fields, line.split("|"), strict=False)) for line in out.stdout.splitlines() if line
    ]


def slurm_config() -> dict:
    cfg = small_config()
    cfg["experiment"] = "slurm"
    cfg["train"]["distributed"] = {"nodes": 2, "gpus_per_node": 1}
    return cfg


def readme_slurm_command() -> list[str]:
    """The `snakemake --profile profiles/slurm ...` command of the SLURM block of docs/slurm.md."""
    commands = block("make venv && source .venv/bin/activate")
    commands = [c for c in commands if c.startswith("snakemake ")]
    assert len(commands) == 1, commands
    return shlex.split(commands[0])


def command_here(workdir: Path, cfg: dict) -> list[str]:
    """The README's command with its paths made absolute and its config file replaced by ``cfg``,
    run in ``workdir`` with the tests' faster status polling."""
    cmd = readme_slurm_command()
    assert cmd[:3] == ["snakemake", "--profile", "profiles/slurm"], cmd
    configfile = cmd.index("--configfile")
    cfg_path = workdir / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    args = cmd[1:configfile] + cmd[configfile + 2 :]
    args[args.index("profiles/slurm")] = str(REPO / "profiles" / "slurm")
    return [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")] + [
        "--directory",
        str(workdir),
        *args,
        *FAST[2:],
        "--configfile",
        str(cfg_path),
    ]


def slurm_env(**extra) -> dict:
    return snakemake_env({**os.environ, **ENV, **extra})


def start_command(workdir: Path, cmd: list[str]) -> Started:
    """``cmd`` started in the background, its output in files beside ``workdir``."""
    out, err = (workdir.with_name(workdir.name + ext) for ext in (".out", ".err"))
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, env=slurm_env())
    return Started(proc, out, err)


def running_evaluation() -> str | None:
    """A running evaluate job's id (its comment names the rule), or None."""
    out = subprocess.run(
        ["squeue", "-h", "-t", "RUNNING", "-o", "%i|%k"], capture_output=True, text=True
    ).stdout
    for line in out.splitlines():
        job, comment = line.split("|", 1)
        if comment.startswith("rule_evaluate_wildcards"):
            return job
    return None


# start_slurm_run's monitor: the evaluation job it requeued (None: none ran while the run did)
REQUEUED: dict[str, str | None] = {}


def requeue_first_evaluation(run: Started) -> None:
    """Requeue the first evaluation job seen running while ``run`` runs (a preemption)."""
    while run.proc.poll() is None:
        job = running_evaluation()
        # a job that ended between squeue and scontrol is not requeued: the next one is
        if job and subprocess.run(["scontrol", "requeue", job]).returncode == 0:
            REQUEUED["evaluate"] = job
            return
        time.sleep(0.5)
    REQUEUED["evaluate"] = None


def start_slurm_run(workdir: Path) -> Started:
    """The README's command with the monitor that requeues one of its evaluation jobs."""
    run = start_command(workdir, command_here(workdir, slurm_config()))
    threading.Thread(target=requeue_first_evaluation, args=(run,), daemon=True).start()
    return run


pytestmark = [pytest.mark.slow, pytest.mark.slurm]


@pytest.fixture(scope="module")
def slurm_run(cluster, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("slurm-run")
    cfg = slurm_config()
    proc = wait_snakemake(start_slurm_run(workdir))
    assert "MissingOutputException" not in proc.stdout + proc.stderr
    assert "Error in rule" not in proc.stdout + proc.stderr
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
    # the rendezvous at the first node's address (NodeAddr), not its name, which need not resolve
    addr = run_tool("scontrol", "show", "node", "-o", "sr1").stdout.split("NodeAddr=")[1].split()[0]
    assert "srun --nodes=2 --ntasks-per-node=1" in log and f"--rdzv-endpoint={addr}:" in log


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


def test_the_requeued_evaluation_ran_again_and_wrote_its_own_outputs(slurm_run):
    workdir, cfg, proc, root, sidecars = slurm_run
    requeued = REQUEUED.get("evaluate")
    assert requeued, "no evaluation job ran while the run did"
    ids = {prov["slurm_job_id"] for prov in sidecars.values()}
    assert requeued in ids  # its sidecars name it: it wrote its own outputs when it ran again
    states = {r["JobIDRaw"]: r["State"] for r in sacct(ids, "JobIDRaw", "State")}
    assert set(states.values()) == {"COMPLETED"}, states  # sacct agrees with snakemake


def test_cpus_per_node_were_capped_at_the_nodes_without_cores(slurm_run):
    """The README's command has no --cores: the profile's 8 to 64 threads are capped at the nodes'
    2 CPUs (training: 2 nodes)."""
    workdir, cfg, proc, root, sidecars = slurm_run
    assert "--cores" not in proc.args
    ids = {prov["slurm_job_id"] for prov in sidecars.values()}
    cpus = sacct(ids, "JobIDRaw", "AllocCPUS", "NNodes")
    assert max(int(r["AllocCPUS"]) / int(r["NNodes"]) for r in cpus) <= 2


def test_job_logs_carry_no_harmless_load_messages(slurm_run):
    """torchao / bitsandbytes load messages are dropped at their loggers (stillroom.HARMLESS)."""
    workdir, cfg, proc, root, sidecars = slurm_run
    logs = list((root / "logs").rglob("*.log"))
    assert any(p.name == "train.log" for p in logs)
    for log in logs:
        assert harmless_lines(log.read_text()) == [], log
