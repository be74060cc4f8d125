"""The documentation's shell commands as the tests run them: verbatim, taken from README.md and
docs/*.md at test time, so a command edited there is the command a test runs. Each ```bash block is
found by its first command, in whichever of those files holds it; tests/workflow/test_readme.py
keeps every block tied to the test that runs it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = REPO / ".venv" / "bin"


def documents() -> list[Path]:
    """The files whose ```bash blocks the tests run: the README and every page under docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def documented() -> list[tuple[Path, list[str]]]:
    """The commands of every ```bash block of ``documents()``, each with the file holding it."""
    return [(path, b) for path in documents() for b in blocks(path.read_text())]


def blocks(text: str | None = None) -> list[list[str]]:
    """The commands of each ```bash block of ``text`` (default: of every documented file):
    continuation lines joined, comments and blank lines dropped."""
    if text is None:
        return [b for _, b in documented()]
    out = []
    for body in re.findall(r"^```bash\n(.*?)^```", text, re.M | re.S):
        commands, pending = [], ""
        for line in body.splitlines():
            line = pending + line
            if line.rstrip().endswith("\\"):
                pending = line.rstrip()[:-1]
                continue
            pending = ""
            # a comment starts at a '#' after whitespace (no documented command quotes one)
            command = re.sub(r"(^|\s+)#.*$", "", line).strip()
            if command:
                commands.append(" ".join(command.split()))
        out.append(commands)
    return out


def block(first: str) -> list[str]:
    """The commands of the one documented block whose first command starts with ``first``."""
    found = [(path, b) for path, b in documented() if b and b[0].startswith(first)]
    where = [str(path.relative_to(REPO)) for path, _ in found]
    assert len(found) == 1, f"{len(found)} ```bash blocks start with {first!r}, not 1: {where}"
    return found[0][1]


def script_module(name: str):
    """scripts/<name>.py as a module (scripts/ is no package): what a docs test compares with."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bundle_figures():
    """scripts/readme_bundle_figures.py as a module: the file and words of the bundle figures."""
    return script_module("readme_bundle_figures")


def repo_copy(dest: Path) -> Path:
    """The repository as a fresh clone has it (tracked files and untracked ones git does not
    ignore, modification times kept, so make sees the venv as up to date) in ``dest``, with the
    virtual environment linked in: where a README command runs as a new user would run it."""
    # make would reinstall the shared venv from the copy (an editable install pointing there)
    stamp = VENV_BIN / "stillroom"
    assert stamp.exists() and stamp.stat().st_mtime >= (REPO / "pyproject.toml").stat().st_mtime, (
        "the venv is older than pyproject.toml: run `make venv` before the README's commands"
    )
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        src = REPO / name
        if src.is_file():  # a deleted file git still lists is skipped
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name, follow_symlinks=False)
    (dest / ".venv").symlink_to(REPO / ".venv")
    return dest


def user_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment as a new shell has it: the venv neither active nor on PATH, so a
    README command that forgets to activate it fails as it would for the user."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != VENV_BIN
    )
    return {**env, **(extra or {})}


def script(commands: list[str]) -> list[str]:
    """``commands`` as one bash session that stops at the first failure, each echoed first, its
    output and errors in one stream (in order)."""
    lines = ["set -euo pipefail", "exec 2>&1"]
    for c in commands:
        lines += [f"echo {shlex.quote('$ ' + c)}", c]
    return ["bash", "-c", "\n".join(lines)]


def start(commands: list[str], copy: Path, workdir: Path, nice: int):
    """``commands`` started as one shell session (``script``) in the repository copy ``copy`` as
    a new user's shell (``user_env``), at niceness ``nice``; its output in files beside
    ``workdir`` (tests/conftest.py Started)."""
    from .conftest import Started

    out, err = (workdir.with_name(workdir.name + ext) for ext in (".out", ".err"))
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            script(commands),
            cwd=copy,
            stdout=stdout,
            stderr=stderr,
            env=user_env(),
            preexec_fn=lambda: os.nice(nice),
        )
    return Started(proc, out, err)
