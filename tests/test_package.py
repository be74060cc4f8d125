"""The package as a whole: laid out without import cycles, installable as a wheel (not only
editable) with the data it reads, and clean under the project's linter and formatter."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "stillroom"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        if {"problems", "solutions"} & set(path.parts):
            continue
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the stillroom modules it imports, at the top or inside a function."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = (
                    ".".join(base + ([node.module] if node.module else []))
                    if node.level
                    else node.module
                )
                # "from . import x" imports the module x when there is one, else a name of "."
                targets = [
                    f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names
                ]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def package_of(module: str) -> str:
    """The part of the package a module belongs to: its subpackage under stillroom
    (``stillroom.data.sources`` -> ``data``), or the root module itself (``stillroom.io`` -> ``io``;
    ``stillroom`` for the package's own ``__init__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph(graph: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """Subpackage -> the other subpackages (and root modules) its modules import, from the module
    graph: a lazy import inside a function is an edge too (it runs whenever the function does)."""
    graph = import_graph() if graph is None else graph
    out: dict[str, set[str]] = {package_of(m): set() for m in graph}
    for module, imported in graph.items():
        out[package_of(module)] |= {package_of(t) for t in imported} - {package_of(module)}
    return out


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_no_import_cycles_between_subpackages():
    """A subpackage depends on the ones below it and none above: no two import each other, even
    through others (data -> grading -> kernels -> data would make every change to one a change
    to all three)."""
    assert cycles(package_graph()) == []


def test_the_package_graph_folds_modules_into_their_subpackage():
    modules = {
        "stillroom": set(),
        "stillroom.io": set(),
        "stillroom.data.sources": {"stillroom.grading.dispatch", "stillroom.io"},
        "stillroom.data.records": {"stillroom.io"},
        "stillroom.grading.dispatch": {"stillroom.kernels.reward"},
        "stillroom.kernels.reward": {"stillroom.data.records"},
    }
    assert cycles(modules) == []  # no module cycle ...
    assert package_graph(modules) == {
        "stillroom": set(),
        "io": set(),
        "data": {"grading", "io"},
        "grading": {"kernels"},
        "kernels": {"data"},
    }
    assert cycles(package_graph(modules)) == [["data", "grading", "kernels"]]  # ... a package one


def test_the_package_root_holds_only_shared_foundations_and_entry_points():
    """Everything else lives in the subpackage of its role (provenance/, review/, plan/,
    gpucheck/, ...): a module added at the root must say why it is a foundation."""
    foundations = {"io", "ids", "sandbox"}  # imported by every layer
    entry_points = {"cli", "workflow", "__main__"}  # the command line; Snakemake's command line
    root = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert root <= foundations | entry_points, root - foundations - entry_points


def test_the_kernel_track_depends_only_on_config_io_and_the_sandbox():
    """kernels/ is a leaf: a change to the data, grading or training code never reaches the
    validator."""
    allowed = {"config", "io", "sandbox"}
    for module, imported in import_graph().items():
        if module.startswith("stillroom.kernels."):
            outside = {package_of(m) for m in imported} - {"kernels"}
            assert outside <= allowed, (module, outside - allowed)


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_kernel_track_is_imported_only_by_kernel_specific_code():
    kernel_specific = {
        "stillroom.grading.kernel",  # the kernel grader
        "stillroom.runtime.grpo",  # GRPO on kernel problems
        "stillroom.data.sources",  # a kind: kernels source
        "stillroom.data.kernelbook",  # KernelBook rows, graded by the kernel reward
        "stillroom.teachers.kernel",  # the procedural teacher's answers to kernel problems
        "stillroom.plan.estimate",  # the problems a kind: kernels source counts
        "stillroom.gpucheck.kernels",  # the GPU check compiles the kernel solutions
        "stillroom.stages.student",  # the tokenizer learns the training problems' reference code
        "stillroom.plan.dag",  # kernel problem and solution files are the workflow's inputs
        "stillroom.plan.checks",  # a kernel source's problem names, checked before any job
        "stillroom.review.recompute",  # --recompute regrades a kernel grade with its key
    }
    for module, imported in import_graph().items():
        if module.startswith("stillroom.kernels"):
            continue
        uses = {m for m in imported if m.startswith("stillroom.kernels")}
        assert not uses or module in kernel_specific, (module, uses)


def test_ruff_finds_nothing():
    ruff = Path(sys.executable).parent / "ruff"
    check = subprocess.run([ruff, "check", "."], cwd=REPO, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout[-4000:]
    fmt = subprocess.run([ruff, "format", "--check", "."], cwd=REPO, capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stdout[-4000:]


def test_the_config_schema_file_is_the_generated_one():
    from stillroom.config import schema

    shipped = json.loads((PACKAGE / "config" / "schema.json").read_text())
    assert shipped == schema(), "regenerate it: stillroom schema > stillroom/config/schema.json"


@pytest.mark.slow
def test_a_wheel_carries_its_data_and_runs_without_the_repository(tmp_path):
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, REPO],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = dist.glob("stillroom-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "stillroom/config/schema.json" in names
    problems = {n for n in names if n.startswith("stillroom/kernels/problems/")}
    solutions = {n for n in names if n.startswith("stillroom/kernels/solutions/")}
    assert len(problems) == len(list((PACKAGE / "kernels" / "problems").glob("*.py"))) >= 40
    assert len(solutions) == len(list((PACKAGE / "kernels" / "solutions").glob("*.py")))
    site = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", site, wheel],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    # The wheel's package first (the dependencies still come from this environment), run from
    # elsewhere than the repository.
    env = {**os.environ, "PYTHONPATH": str(site)}

    def stillroom(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "stillroom", *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)

    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import stillroom, stillroom.kernels as k; print(stillroom.__file__);"
            "print(len(list(k.PROBLEMS_DIR.glob('*.py'))))",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    module, count = where.stdout.split()
    assert module.startswith(str(site)) and int(count) == len(problems)
    assert stillroom("--help").returncode == 0
    checked = stillroom("config", str(REPO / "config" / "config.yaml"), "--root", str(REPO))
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["train"]["max_length"] == 512
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        (REPO / "config" / "config.yaml").read_text().replace("ngram: 13", "ngram: 2")
    )
    refused = stillroom("config", str(broken), "--root", str(REPO))
    assert refused.returncode == 2 and "decontam.ngram" in refused.stderr
    assert json.loads(stillroom("schema").stdout) == json.loads(
        (PACKAGE / "config" / "schema.json").read_text()
    )
