"""The workflow this package came with, and Snakemake's command line on it: one definition for the
tests, the benchmarks and the SLURM plan."""

from __future__ import annotations

import os
import signal
import sys
import threading
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


def cancel_on_sigterm() -> threading.Event:
    """From now on, SIGTERM stops this Snakemake process as Ctrl-C does, and the returned event
    says one came. Snakemake's own SIGTERM handler waits for every running job to end (hours for
    a training job, then up to one status-polling interval, 180 s at most, before it notices) and
    then reports that a job did not complete; its Ctrl-C path cancels the executor's jobs at once
    (the SLURM plugin's cancel_jobs: one scancel of every active job) and returns after the status
    thread's current sleep."""
    received = threading.Event()

    def stop(signum, frame):
        received.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    return received
