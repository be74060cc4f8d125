"""DAG construction time for the real distillation recipe and for a stress config.

Times `snakemake -n` (parse, validate, build the whole DAG, schedule; no job runs) in a fresh
temporary directory: the beam-distill recipe (62 shards x 4 efforts, training, merges, evaluation)
and the same recipe at --stress-shards shards on every effort (default 2,000). Prints seconds and
job counts, with the local profile and with profiles/slurm (whose resource expressions are
evaluated for every job); a second, warm run shows the cost without Python's first imports.

    python bench/dag_build_time.py [--stress-shards 2000] [--repeats 2]
"""

import argparse
import copy
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from stillroom.plan.slurm import PLACEHOLDER_ENV
from stillroom.workflow import REPO, snakemake_command, snakemake_env


def dry_run(config: dict, profile: str) -> tuple[float, int]:
    with tempfile.TemporaryDirectory(prefix="stillroom-dag-") as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        cmd = snakemake_command(
            tmp,
            "-n",
            "--quiet",
            "rules",
            "--cores",
            "1",
            "--profile",
            str(REPO / "profiles" / profile),
            configfiles=[path],
        )
        env = snakemake_env({**PLACEHOLDER_ENV, **os.environ, "HF_HUB_OFFLINE": "1"})
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        if proc.returncode:
            sys.exit(f"snakemake -n failed:\n{proc.stderr[-3000:]}")
        total = re.search(r"^total\s+(\d+)", proc.stdout + proc.stderr, re.M)
        return seconds, int(total.group(1)) if total else -1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stress-shards", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    recipe = yaml.safe_load((REPO / "config" / "experiments" / "beam-distill.yaml").read_text())
    stress = copy.deepcopy(recipe)
    stress["experiment"] = "beam-distill-stress"
    stress["generation"]["shards"] = args.stress_shards
    # every effort on every shard
    stress["generation"]["effort_shards"] = {}
    print(f"{'config':<34}{'profile':<9}{'jobs':>8}  seconds per dry run")
    for name, cfg in (
        ("beam-distill (62 shards)", recipe),
        (f"stress ({args.stress_shards} shards x 4 efforts)", stress),
    ):
        # slurm: resource expressions evaluated for every job
        for profile in ("default", "slurm"):
            times, jobs = [], 0
            for _ in range(args.repeats):
                seconds, jobs = dry_run(cfg, profile)
                times.append(seconds)
            print(f"{name:<34}{profile:<9}{jobs:>8}  " + "  ".join(f"{t:6.2f}" for t in times))


if __name__ == "__main__":
    main()
