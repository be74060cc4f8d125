"""The kernel problems a ``kind: kernels`` source gives: the project's own KernelBench-style set
(``problems/``, each with a reference Triton solution in ``solutions/``), the files of a ``dir``, or
a generated ``family`` (``family.py``, each problem with a templated solution)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..config.data import KernelSource
from ..data.records import record
from ..io import DataError
from . import family as families

PROBLEMS_DIR = Path(__file__).parent / "problems"
SOLUTIONS_DIR = Path(__file__).parent / "solutions"
FAMILY_FILE = Path(families.__file__)  # what a generated family's problems and solutions come from


def _source(spec: KernelSource | Mapping[str, Any]) -> KernelSource:
    return KernelSource.parse(spec, where="sources")


def _wanted(spec: KernelSource, available: list[str], where: str) -> list[str]:
    """``problems`` (default: all of ``available``), each checked to exist."""
    wanted = spec.problems or available
    missing = [w for w in wanted if w not in available]
    if missing:
        raise DataError(
            f"source '{spec.name}': no problem file for {missing} in {where} "
            f"(have {len(available)})"
        )
    return wanted


def kernel_files(spec: KernelSource | Mapping[str, Any]) -> dict[str, Path]:
    """The problem files of a source by name; ``problems`` names a subset. A generated family has
    none (its generator, FAMILY_FILE, is what its records depend on)."""
    spec = _source(spec)
    if spec.family:
        _wanted(spec, families.problem_names(spec.family), f"family {spec.family}")
        return {}
    name, root = spec.name, Path(spec.dir or PROBLEMS_DIR)
    available = {p.stem: p for p in sorted(root.glob("*.py")) if not p.name.startswith("_")}
    if not available:
        raise DataError(f"source '{name}': no problem files (*.py) in {root}")
    return {stem: available[stem] for stem in _wanted(spec, sorted(available), str(root))}


def solution_files(spec: KernelSource | Mapping[str, Any]) -> dict[str, Path]:
    """The reference solutions of a source's problems (the project's own set has them)."""
    spec = _source(spec)
    if spec.dir or spec.family:
        return {}
    candidates = {stem: SOLUTIONS_DIR / f"{stem}.py" for stem in kernel_files(spec)}
    return {stem: path for stem, path in candidates.items() if path.exists()}


def problem_count(spec: KernelSource | Mapping[str, Any]) -> int:
    """How many problems a source gives."""
    spec = _source(spec)
    if spec.family:
        return len(_wanted(spec, families.problem_names(spec.family), f"family {spec.family}"))
    return len(kernel_files(spec))


def reference_solution(solution: str, family: str | None = None) -> str:
    """The reference Triton solution a record's meta names: a file of ``solutions/``, or the
    template of a generated family."""
    if family:
        return families.solution_source(solution)
    return (SOLUTIONS_DIR / f"{solution}.py").read_text(encoding="utf-8")


def kernel_records(spec: KernelSource | Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Problem files (a ``Model``, ``get_inputs``, ``get_init_inputs``) as pool records. The file is
    both the prompt and the gold: the validator runs it as the reference."""
    spec = _source(spec)
    if spec.family:
        for stem in _wanted(spec, families.problem_names(spec.family), f"family {spec.family}"):
            src = families.problem_source(stem)
            meta = {"problem": stem, "solution": stem, "family": spec.family}
            yield record(spec.name, "kernel", src, src, meta)
        return
    solutions = solution_files(spec)
    for stem, path in kernel_files(spec).items():
        src = path.read_text(encoding="utf-8")
        meta = {"problem": stem, **({"solution": stem} if stem in solutions else {})}
        yield record(spec.name, "kernel", src, src, meta)
