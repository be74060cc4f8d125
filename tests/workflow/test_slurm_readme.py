"""The README's SLURM command, taken from README.md's text, run on the local test cluster
(scripts/slurm-up.sh) with the small config: no --cores (threads are capped at the largest node's
CPUs), shapes and account checked before the first sbatch, and one evaluation job requeued while
it runs (the profile submits without arrays: README, profiles/slurm/profile.yaml)."""

import os
import re
import shlex
import subprocess
import sys
import time

import pytest
import yaml

from stillroom.workflow import snakemake_env

from ..conftest import REPO
from .test_slurm import ENV, FAST, cluster, sacct, slurm_config  # noqa: F401 (cluster: a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cluster")]


def readme_slurm_command() -> list[str]:
    """The `snakemake --profile profiles/slurm ...` line of the README's SLURM section."""
    text = (REPO / "README.md").read_text()
    section = text.split("### On a SLURM cluster", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)[1]
    lines = [ln for ln in block.splitlines() if ln.startswith("snakemake ")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0].split("#")[0])


def command_here(tmp_path, cfg: dict) -> list[str]:
    """The README's command with its paths made absolute and its config file replaced by ``cfg``,
    run in ``tmp_path`` with the tests' faster status polling."""
    cmd = readme_slurm_command()
    assert cmd[:3] == ["snakemake", "--profile", "profiles/slurm"], cmd
    configfile = cmd.index("--configfile")
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    args = cmd[1:configfile] + cmd[configfile + 2 :]
    args[args.index("profiles/slurm")] = str(REPO / "profiles" / "slurm")
    polling = REPO / "tests" / "workflow" / "slurm_fast_polling.py"
    return [sys.executable, str(polling), "-s", str(REPO / "Snakefile")] + [
        "--directory",
        str(tmp_path),
        *args,
        *FAST[2:],
        "--configfile",
        str(cfg_path),
    ]


def env(**extra):
    return snakemake_env({**os.environ, **ENV, **extra})


def test_wrong_or_empty_account_and_impossible_shapes_are_refused_before_submitting(tmp_path):
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    cmd = command_here(tmp_path, slurm_config())
    for account, line in [
        ("nope", "SLURM_ACCOUNT=nope is not an account of"),
        ("", "SLURM_ACCOUNT is empty: set it to an account of"),
    ]:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env(SLURM_ACCOUNT=account), timeout=600
        )
        assert proc.returncode != 0 and line in proc.stderr, proc.stderr[-3000:]
        assert "invalid option" not in proc.stderr
    wide = slurm_config()
    wide["train"]["distributed"] = {"nodes": 3, "gpus_per_node": 1}
    proc = subprocess.run(
        command_here(tmp_path, wide), capture_output=True, text=True, env=env(), timeout=600
    )
    assert proc.returncode != 0
    assert re.search(
        r"rule train asks \d+ CPUs, \d+ MB, 1 GPUs per node on 3 node\(s\); partition gpu's "
        r"largest node \(sr\d\) has 2 CPUs, \d+ MB, 2 GPUs \(2 node\(s\)\)",
        proc.stderr,
    ), proc.stderr[-3000:]
    after = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    assert "Submitted" not in proc.stdout + proc.stderr and set(after.split()) <= set(
        before.split()
    )


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


def test_readme_command_runs_and_survives_a_requeued_evaluation(tmp_path):
    cmd = command_here(tmp_path, slurm_config())
    out, err = tmp_path.with_suffix(".out"), tmp_path.with_suffix(".err")
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(cmd, stdout=o, stderr=e, env=env())
    requeued = None
    try:
        while proc.poll() is None and requeued is None:
            requeued = running_evaluation()
            time.sleep(0.5)
        assert requeued, "no evaluation job ran"
        subprocess.run(["scontrol", "requeue", requeued], check=True)
        proc.wait(timeout=1800)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=120)
    log = out.read_text() + err.read_text()
    assert proc.returncode == 0, log[-6000:]
    assert "MissingOutputException" not in log and "Error in rule" not in log
    root = tmp_path / "results" / "slurm"
    for bench in slurm_config()["eval"]["benchmarks"]:
        assert (root / "tables" / f"{bench}.md").exists()
    sidecars = [yaml.safe_load(p.read_text()) for p in root.rglob("*.prov.json")]
    ids = {s["slurm_job_id"] for s in sidecars}
    states = {r["JobIDRaw"]: r["State"] for r in sacct(ids, "JobIDRaw", "State")}
    assert set(states.values()) == {"COMPLETED"}, states  # sacct agrees with snakemake
    assert requeued in ids  # the requeued job wrote its own outputs when it ran again
    # CPUs per node were capped at the nodes' 2, not the profile's 8 to 64 (training: 2 nodes)
    cpus = sacct(ids, "JobIDRaw", "AllocCPUS", "NNodes")
    assert max(int(r["AllocCPUS"]) / int(r["NNodes"]) for r in cpus) <= 2
