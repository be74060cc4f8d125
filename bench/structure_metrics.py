"""Structure metrics of a Stillroom checkout: modules and subpackages in import cycles, the
subpackages' import graph, root modules, module sizes, long lines, linter findings,
`snakemake --lint` findings.

    python bench/structure_metrics.py [CHECKOUT ...]

Default: this checkout. Give an older checkout (e.g. a `git worktree` of an earlier commit) to
compare in the same run; its Snakefile is linted with this environment's Snakemake.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_package import cycles  # noqa: E402 - after the path of this checkout

DATA = {"problems", "solutions"}


def graph_of(root: Path) -> dict[str, set[str]]:
    """The import graph of ``root``'s package, as tests/test_package.py builds it."""
    import tests.test_package as tp

    saved = tp.REPO, tp.PACKAGE
    tp.REPO, tp.PACKAGE = root, root / "stillroom"
    try:
        return tp.import_graph()
    finally:
        tp.REPO, tp.PACKAGE = saved


def package_graph_of(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The subpackages' graph of a module graph, as tests/test_package.py folds it (an older
    checkout's tests may not have ``package_graph``)."""
    out: dict[str, set[str]] = {}
    for module, imported in graph.items():
        mine = package_of(module)
        out.setdefault(mine, set()).update({package_of(t) for t in imported} - {mine})
    return out


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def metrics(root: Path) -> dict[str, object]:
    graph = graph_of(root)
    packages = package_graph_of(graph)
    files = [p for p in (root / "stillroom").rglob("*.py") if not DATA & set(p.parts)]
    sizes = sorted(
        ((len(p.read_text().splitlines()), p.relative_to(root)) for p in files), reverse=True
    )
    long_lines = sum(len(line) > 100 for p in files for line in p.read_text().splitlines())
    bindir = Path(sys.executable).parent
    ruff = subprocess.run(
        [
            bindir / "ruff",
            "check",
            "--statistics",
            "--isolated",
            "--line-length",
            "100",
            "--select",
            "E,W,F,I,B,UP",
            "--extend-exclude",
            "stillroom/kernels/problems,stillroom/kernels/solutions",  # data, not code
            "stillroom",
        ],
        cwd=root,
        capture_output=True,
        text=True,
    )
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    lint = subprocess.run(
        [sys.executable, "-m", "snakemake", "--lint"],
        cwd=root,
        capture_output=True,
        text=True,
        env=env,
    )
    return {
        "modules in import cycles": sum(len(c) for c in cycles(graph)),
        "subpackage import cycles": "; ".join(" <-> ".join(c) for c in cycles(packages)) or "none",
        "root modules": sum(
            p.name not in ("__init__.py", "__main__.py") for p in (root / "stillroom").glob("*.py")
        ),
        "subpackage imports": "\n"
        + "\n".join(
            f"    {name:<14} -> {', '.join(sorted(deps)) or '-'}"
            for name, deps in sorted(packages.items())
            if (root / "stillroom" / name).is_dir()
        ),
        "largest module (lines)": f"{sizes[0][0]} ({sizes[0][1]})",
        "modules over 300 lines": sum(n > 300 for n, _ in sizes),
        "library lines over 100 characters": long_lines,
        "ruff findings (E,W,F,I,B,UP) in stillroom/": sum(
            int(m) for m in re.findall(r"^\s*(\d+)\s", ruff.stdout, re.MULTILINE)
        ),
        "snakemake --lint findings": len(re.findall(r"^\s+\* ", lint.stdout + lint.stderr, re.M)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs="*", type=Path, default=[Path(__file__).parents[1]])
    args = parser.parse_args()
    for root in args.checkouts:
        print(f"{root.resolve()}:")
        for key, value in metrics(root.resolve()).items():
            print(f"  {key:<45} {value}")


if __name__ == "__main__":
    main()
