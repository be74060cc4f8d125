import importlib.util
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from stillroom.workflow import snakemake_command, snakemake_env

from ..conftest import REPO, Started

# Workflow runs that tests only read, started as soon as those tests are collected and run beside
# the other tests, which go first. A test asks for one with @pytest.mark.early_run.with_args(start)
# (a lone function argument would be taken as what the mark decorates), start(workdir) ->
# Started | None, and reads it with started(start). A run starts at EARLY_NICE, it and every job it
# starts (scripts/slurm-up.sh has SLURM jobs keep their sbatch's niceness), so it takes the CPU the
# tests leave idle and slows them as little as it can. Measured on a fresh clone: pytest took
# 1607 s so, against 1714 s with the recipe twin (the longer run) at the tests' priority.
EARLY_NICE = 19
_RUNS: dict[Callable, tuple[Path, Started | None] | BaseException] = {}


def pytest_collection_modifyitems(items):
    # the tests that wait for an early run go last, in their order (module fixtures stay shared)
    late = [item for item in items if item.get_closest_marker("early_run")]
    items[:] = [item for item in items if not item.get_closest_marker("early_run")] + late


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    for item in session.items:
        for mark in item.iter_markers("early_run"):
            start = mark.args[0]
            if start not in _RUNS:
                workdir = session.config._tmp_path_factory.mktemp(start.__name__)
                try:
                    _RUNS[start] = (workdir, start(workdir))
                except Exception as exc:  # raised by the test that reads it, not here
                    _RUNS[start] = exc


def pytest_sessionfinish(session):
    for run in _RUNS.values():  # an interrupted session: snakemake cancels its jobs
        if isinstance(run, tuple) and run[1] is not None and run[1].proc.poll() is None:
            run[1].proc.terminate()
            try:
                run[1].proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                run[1].proc.kill()


def started(start: Callable) -> tuple[Path, Started | None]:
    """The working directory and the run ``start`` began there (its test is marked early_run)."""
    run = _RUNS[start]
    if isinstance(run, BaseException):
        raise run
    return run


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
