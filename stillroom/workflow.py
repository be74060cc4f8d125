"""The workflow this package came with, and Snakemake's command line on it: one definition for the
tests, the benchmarks and the SLURM plan."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path


def _workflow() -> Path:
    """The checkout this package sits in (or an editable install of one), else the current
    directory (a wheel installed elsewhere, run from the repository)."""
    beside = Path(__file__).resolve().parent.parent
    return beside if (beside / "Snakefile").exists() else Path.cwd()


REPO = _workflow()


def snakemake_command(
    workdir: str | Path, *args: str, configfiles: Iterable[str | Path] = ()
) -> list[str]:
    """``snakemake`` on this workflow, run in ``workdir`` (where results/ and .snakemake/ go), with
    this interpreter; ``configfiles`` come last, so they cannot swallow a target."""
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]
    cmd += ["--directory", str(workdir), *args]
    configfiles = [str(Path(c).resolve()) for c in configfiles]
    return cmd + ["--configfile", *configfiles] if configfiles else cmd


def snakemake_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with this interpreter's bin directory first on PATH, so a
    job's ``stillroom`` command is this installation's."""
    env = dict(os.environ if env is None else env)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env
