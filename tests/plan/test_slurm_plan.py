"""`stillroom plan`: the SLURM plan as a command of its own, offline, its training phases by name
(issue 42, stumble 7). The sbatch lines themselves: tests/workflow/test_slurm_profile.py."""

import os
import re
import subprocess
import sys

from stillroom.workflow import REPO, snakemake_env

DISTILL = REPO / "config" / "experiments" / "beam-distill.yaml"


def test_the_plan_asks_no_controller_and_names_the_training_phases(tmp_path):
    """It took 47-56 s: the executor plugin runs `scontrol show config` when imported (~9 s each
    where the controller is down), once in snakemake's process and once in the plan's. A stand-in
    scontrol first on PATH records the SLURM config each call was given."""
    calls = tmp_path / "scontrol.calls"
    fake = tmp_path / "bin" / "scontrol"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "${{SLURM_CONF-unset}}" >> {calls}\nexit 1\n')
    fake.chmod(0o755)
    # a caller's own SLURM config (the suite's is os.devnull, tests/conftest.py), which the plan
    # must not pass on
    env = {**snakemake_env(), "SLURM_CONF": str(tmp_path / "slurm.conf")}
    env["PATH"] = f"{fake.parent}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(
        [sys.executable, "-m", "stillroom", "plan", "--configfile", str(DISTILL)],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rules = {line.split()[0]: line for line in proc.stdout.splitlines()}
    # the seed's two phases: two epochs on medium traces on 4 GPUs, then the efforts on 8
    assert "--gpus=4" in rules["train[phase=medium]"]
    assert "--gpus=8" in rules["train[phase=efforts]"]
    assert not [r for r in rules if "phase=-" in r or "phase=]" in r]
    # the teacher's 8 servers, each an allocation with its shards' jobs (62 medium, 20 grouped)
    servers = [line for rule, line in rules.items() if rule.startswith("serve_teacher")]
    assert sum(int(line.split()[1]) for line in servers) == 8
    held = [int(n) for line in servers for n in re.findall(r"with (\d+) generate jobs", line)]
    assert sum(held) == 62 + 20
    # every call the plugin made was told there is no SLURM configuration: it failed at once
    assert set(calls.read_text().split()) == {os.devnull}
