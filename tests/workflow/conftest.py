import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from stillroom.workflow import snakemake_command, snakemake_env

from ..conftest import REPO


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
