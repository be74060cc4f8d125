"""The documented SLURM command, taken from docs/slurm.md's text, on the local test cluster
(scripts/slurm-up.sh): a wrong or empty account and a shape no node holds are refused before the
first sbatch; SIGTERM cancels its jobs and stops it at once. The command's full run, with a
requeued evaluation, is test_slurm.py's (the suite's one SLURM run)."""

import re
import signal
import subprocess
import time

import pytest

from .test_slurm import command_here, sacct, slurm_config, slurm_env, start_command

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.usefixtures("cluster")]
SUBMITTED = r"has been submitted with SLURM jobid (\d+)"  # the plugin's line per sbatch


def test_wrong_or_empty_account_and_impossible_shapes_are_refused_before_submitting(tmp_path):
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    cmd = command_here(tmp_path, slurm_config())
    for account, line in [
        ("nope", "SLURM_ACCOUNT=nope is not an account of"),
        ("", "SLURM_ACCOUNT is empty: set it to an account of"),
    ]:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=slurm_env(SLURM_ACCOUNT=account), timeout=600
        )
        assert proc.returncode != 0 and line in proc.stderr, proc.stderr[-3000:]
        assert "invalid option" not in proc.stderr
    wide = slurm_config()
    wide["train"]["distributed"] = {"nodes": 3, "gpus_per_node": 1}
    proc = subprocess.run(
        command_here(tmp_path, wide), capture_output=True, text=True, env=slurm_env(), timeout=600
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


def test_sigterm_cancels_the_runs_jobs_and_exits_at_once_without_a_false_failure(tmp_path):
    """It waited 3 and 9 minutes for the running jobs, then said a job did not complete: now the
    run's jobs are cancelled (scancel) and it exits within a status-polling interval (2 s here)."""
    run = start_command(tmp_path, command_here(tmp_path, slurm_config()))
    proc = run.proc
    try:
        submitted = []
        while proc.poll() is None and not submitted:
            submitted = re.findall(SUBMITTED, run.err.read_text())
            time.sleep(0.2)
        assert submitted, run.err.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        proc.wait(timeout=120)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = run.out.read_text() + run.err.read_text()
    assert proc.returncode == 143, log[-4000:]
    assert took < 30, took
    assert "Stopped on SIGTERM: this run's SLURM jobs were cancelled" in log
    assert "did not complete successfully" not in log and "Error in rule" not in log, log[-4000:]
    for _ in range(20):  # sacct records the cancellation within a few seconds
        states = {r["JobIDRaw"]: r["State"] for r in sacct(submitted, "JobIDRaw", "State")}
        if {s.split()[0] for s in states.values()} == {"CANCELLED"}:  # "CANCELLED by <uid>"
            break
        time.sleep(1)
    assert {s.split()[0] for s in states.values()} == {"CANCELLED"}, states
    queued = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    assert not set(submitted) & set(queued.split())
