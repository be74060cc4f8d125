"""The kernel problems a ``kind: kernels`` source gives: the project's own KernelBench-style set
(``problems/``, each with a reference Triton solution in ``solutions/``) or the files of a
``dir``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..config.data import KernelSource
from ..data.records import record
from ..io import DataError

PROBLEMS_DIR = Path(__file__).parent / "problems"
SOLUTIONS_DIR = Path(__file__).parent / "solutions"


def _source(spec: KernelSource | Mapping[str, Any]) -> KernelSource:
    return KernelSource.parse(spec, where="sources")


def kernel_files(spec: KernelSource | Mapping[str, Any]) -> dict[str, Path]:
    """The problem files of a source by name; ``problems`` names a subset."""
    spec = _source(spec)
    name, root = spec.name, Path(spec.dir or PROBLEMS_DIR)
    available = {p.stem: p for p in sorted(root.glob("*.py")) if not p.name.startswith("_")}
    if not available:
        raise DataError(f"source '{name}': no problem files (*.py) in {root}")
    wanted = spec.problems or sorted(available)
    missing = [w for w in wanted if w not in available]
    if missing:
        raise DataError(
            f"source '{name}': no problem file for {missing} in {root} (have {len(available)})"
        )
    return {stem: available[stem] for stem in wanted}


def solution_files(spec: KernelSource | Mapping[str, Any]) -> dict[str, Path]:
    """The reference solutions of a source's problems (the project's own set has them)."""
    spec = _source(spec)
    if spec.dir:
        return {}
    candidates = {stem: SOLUTIONS_DIR / f"{stem}.py" for stem in kernel_files(spec)}
    return {stem: path for stem, path in candidates.items() if path.exists()}


def kernel_records(spec: KernelSource | Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Problem files (a ``Model``, ``get_inputs``, ``get_init_inputs``) as pool records. The file is
    both the prompt and the gold: the validator runs it as the reference."""
    solutions = solution_files(spec)
    for stem, path in kernel_files(spec).items():
        src = path.read_text(encoding="utf-8")
        meta = {"problem": stem, **({"solution": stem} if stem in solutions else {})}
        yield record(_source(spec).name, "kernel", src, src, meta)
