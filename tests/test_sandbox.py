"""The one sandbox for untrusted code, as the code grader runs programs under it: writes outside its
directory, starting processes, memory and output are refused or limited; writes inside are fine."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stillroom.grading.code import grade_code

from .grading.test_code import ADD, GOLD, fenced


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """Where sandboxes are made; every test checks it is left empty (no leftover temporary
    directories)."""
    sandboxes = tmp_path / "sandboxes"
    sandboxes.mkdir()
    yield sandboxes
    assert list(sandboxes.iterdir()) == []


def test_writes_outside_the_sandbox_are_blocked(root):
    outside = Path("/tmp") / f"escape-{uuid.uuid4().hex}"
    for target in (str(outside), "../escape", "../../escape"):
        program = f"with open({target!r}, 'w') as f:\n    f.write('x')\n" + ADD
        result = grade_code(fenced(program), GOLD, timeout_s=5, tmp_root=str(root))
        assert result.status == "error" and "PermissionError: sandbox" in result.stderr_tail
    # Swallowing the error does not help: the file is still never written.
    program = f"try:\n    open({str(outside)!r}, 'w')\nexcept OSError:\n    pass\n" + ADD
    assert grade_code(fenced(program), GOLD, timeout_s=5, tmp_root=str(root)).status == "passed"
    others = [
        "import os\nos.symlink('/tmp', 'link')\nopen('link/escape-{0}', 'w')\n",
        "import os\nos.remove({1!r})\n",
        "import os\nos.mkdir('../made')\n",
        "import os\nos.chdir('..')\nopen('escape', 'w')\n",
        "import shutil\nshutil.rmtree({2!r})\n",
        "import os\nos.rename('_run.py', '../moved')\n",
        "import os\nfd = os.open('/tmp', os.O_RDONLY)\n",
    ]
    keep = root.parent / "keep.txt"
    keep.write_text("keep")
    for other in others:
        program = other.format(outside.name, str(keep), str(root.parent)) + ADD
        result = grade_code(fenced(program), GOLD, timeout_s=5, tmp_root=str(root))
        assert result.status == "error" and "sandbox" in result.stderr_tail, other
    assert not outside.exists() and keep.read_text() == "keep"
    assert sorted(p.name for p in root.parent.iterdir()) == ["keep.txt", "sandboxes"]


def test_writes_inside_the_sandbox_are_allowed(root):
    program = (
        "import os, shutil, tempfile\nos.mkdir('d')\n"
        "with open('d/x.txt', 'w') as f:\n    f.write('hi')\n"
        "os.rename('d/x.txt', 'd/y.txt')\nshutil.rmtree('d')\ntempfile.mkstemp()\n"
        "open(os.path.expanduser('~/notes'), 'w').close()\n"
    ) + ADD
    assert grade_code(fenced(program), GOLD, timeout_s=5, tmp_root=str(root)).status == "passed"


@pytest.mark.parametrize(
    "program",
    [
        "import subprocess\nsubprocess.run(['touch', {marker!r}])\n",
        "import os\nos.system('touch {marker}')\n",
        "import os\nif os.fork() == 0:\n    open({marker!r}, 'w')\n",
        "import os\nos.execv('/bin/touch', ['touch', {marker!r}])\n",
        "import _posixsubprocess\n_posixsubprocess.fork_exec()\n",
        "import subprocess\nsubprocess._fork_exec()\n",  # its own reference to fork_exec
        "import multiprocessing as mp\nmp.get_context('spawn').Process(target=print).start()\n",
        "import ctypes\n",
    ],
)
def test_starting_processes_is_blocked(root, program):
    marker = root.parent / "spawned"
    result = grade_code(
        fenced(program.format(marker=str(marker)) + ADD), GOLD, timeout_s=5, tmp_root=str(root)
    )
    assert result.status == "error" and "PermissionError: sandbox" in result.stderr_tail
    assert not marker.exists()


def test_memory_and_output_are_limited(root):
    assert (
        grade_code(
            fenced("x = bytearray(4 << 30)\n" + ADD), GOLD, timeout_s=5, tmp_root=str(root)
        ).status
        == "error"
    )
    flood = grade_code(
        fenced("while True:\n    print('x' * 4096)\n"), GOLD, timeout_s=5, tmp_root=str(root)
    )
    assert flood.status == "error" and "File too large" in flood.stderr_tail
