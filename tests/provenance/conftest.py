"""Fixtures of the provenance tests: each tampers with a private copy of the shared run."""

import shutil

import pytest


@pytest.fixture
def run(done, tmp_path):
    """A private copy of the finished run (tests/conftest.py ``done``); sidecar paths are
    relative to it."""
    workdir, _, _ = done
    shutil.copytree(workdir / "results", tmp_path / "run" / "results", symlinks=True)
    return tmp_path / "run"
