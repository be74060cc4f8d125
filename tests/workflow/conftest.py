import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from stillroom.workflow import snakemake_command, snakemake_env

from ..conftest import REPO


def run_tool(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900)


def cluster_problem() -> str | None:
    """Why the test cluster of scripts/slurm-up.sh is not usable here, or None."""
    if shutil.which("sbatch") is None:
        return "no SLURM here: `make host` (root, Debian) brings up the test cluster"
    name = run_tool("scontrol", "show", "config")
    if "ClusterName             = stillroom" not in name.stdout:
        return "the test cluster of scripts/slurm-up.sh is not running (ClusterName stillroom)"
    if sum(map(int, run_tool("sinfo", "-h", "-p", "gpu", "-o", "%D").stdout.split())) != 2:
        return "the test cluster's two nodes are not up: run scripts/slurm-up.sh"
    if run_tool("sacct", "-n", "-X", "-S", "now-1minute").returncode:
        return "sacct does not answer (slurmdbd down?): run scripts/slurm-up.sh"
    return None


@pytest.fixture(scope="session")
def cluster():
    """The test cluster, for the tests marked slurm (make test-slurm): they skip without it, and
    fail under CI=true, where .ci/run has brought it up."""
    problem = cluster_problem()
    if problem and os.environ.get("CI"):
        pytest.fail(f"CI must run the SLURM tests: {problem}")
    if problem:
        pytest.skip(problem)


@pytest.fixture(scope="module")
def chaos():
    """bench/chaos.py as a module: its comparison of two runs (tables, records, wall times)."""
    spec = importlib.util.spec_from_file_location("chaos_bench", REPO / "bench" / "chaos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def dry_run(tmp_path_factory):
    """``dry_run(configfiles)``: `snakemake -n -p --cores 2` over these config files (none: the
    embedded default), run once per session, each in a working directory of its own, and the
    directory with the finished process (its shell commands printed). The recipes' DAG tests only
    read a dry run, so the parse, contracts and lint test and the recipes' job-count tests share one
    per recipe."""
    runs: dict[tuple[str, ...], tuple[Path, subprocess.CompletedProcess]] = {}

    def dry(configfiles=()) -> tuple[Path, subprocess.CompletedProcess]:
        key = tuple(str(Path(c).resolve()) for c in configfiles)
        if key not in runs:
            workdir = tmp_path_factory.mktemp("dry-run")
            cmd = snakemake_command(workdir, "-n", "-p", "--cores", "2", configfiles=key)
            proc = subprocess.run(
                cmd,
                cwd=workdir,
                capture_output=True,
                text=True,
                env=snakemake_env(os.environ),
                timeout=600,
            )
            runs[key] = workdir, proc
        return runs[key]

    return dry
