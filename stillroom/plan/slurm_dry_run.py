"""The child process of the SLURM plan (slurm.py): Snakemake's dry run with the profile, run in this
process, then every job's sbatch line rendered by the executor plugin Snakemake has just loaded;
the jobs as JSON on stdout. A process of its own, because Snakemake changes the working directory
and the logging of the process it runs in.

    python -m stillroom.plan.slurm_dry_run SNAKEMAKE_ARGS... --configfile YAML [YAML ...]
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from ..config import load_yaml, merge_configs, resolve
from ..workflow import REPO
from .dag import phase_names
from .slurm import PROFILE, Job, parse_dry_run, sbatch_line


def configfiles(argv: list[str]) -> list[str]:
    """The config files of a Snakemake command line (last, after ``--configfile``)."""
    return argv[argv.index("--configfile") + 1 :] if "--configfile" in argv else []


def phase_label(job: Job, phases: dict[str, str]) -> str:
    """A job's wildcards as the plan prints them: a training phase by its name (``phase=medium``),
    not by its checkpoint suffix (``phase=-medium``; ``phase=`` for the last phase)."""
    if job.rule != "train" or not job.wildcards.startswith("phase="):
        return job.wildcards
    return f"phase={phases[job.wildcards.removeprefix('phase=')]}"


def main(argv: list[str]) -> int:
    from snakemake.cli import main as snakemake_main

    log = io.StringIO()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            snakemake_main(argv)
        except SystemExit as exc:
            code = exc.code
    if code:
        sys.stderr.write(log.getvalue())
        return int(code) if isinstance(code, int) else 1
    merged: dict[str, Any] = {}
    for path in configfiles(argv) or [REPO / "config" / "config.yaml"]:
        merged = merge_configs(merged, load_yaml(path))
    phases = phase_names(resolve(merged, REPO)["train"]["phases"])
    settings = yaml.safe_load(Path(PROFILE).read_text())
    jobs = parse_dry_run(log.getvalue())
    for job in jobs:
        job.sbatch = sbatch_line(job, settings)
        job.wildcards = phase_label(job, phases)
    json.dump([asdict(job) for job in jobs], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
