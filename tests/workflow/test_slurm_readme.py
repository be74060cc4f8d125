"""The README's SLURM command, taken from README.md's text, on the local test cluster
(scripts/slurm-up.sh): a wrong or empty account and a shape no node holds are refused before the
first sbatch. The command's full run, with a requeued evaluation, is test_slurm.py's (the suite's
one SLURM run)."""

import re
import subprocess

import pytest

from .test_slurm import cluster, command_here, slurm_config, slurm_env  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cluster")]


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
