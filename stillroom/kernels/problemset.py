"""The kernel problems a ``kind: kernels`` source gives: the project's own KernelBench-style set
(``problems/``, each with a reference Triton solution in ``solutions/``), the files of a ``dir``
(KernelBench's ``KernelBench/level1/``, say) or the rows of a JSONL ``path`` (KernelBench's
dataset rows: ``code``, ``name``), or a generated ``family`` (``family.py``, each problem with a
templated solution); data/sources.py makes them pool records. Each problem is checked as the
pool is built, and scaled to ``max_input_elements`` when that is set (scaling.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..config.data import KernelSource
from ..io import DataError, iter_lines, parse_row, read_python
from . import family as families
from .scaling import check_inputs, check_problem, scale_problem

PROBLEMS_DIR = Path(__file__).parent / "problems"
SOLUTIONS_DIR = Path(__file__).parent / "solutions"
FAMILY_FILE = Path(families.__file__)  # what a generated family's problems and solutions come from


def _source(spec: KernelSource | Mapping[str, Any]) -> KernelSource:
    return KernelSource.parse(spec, where="sources")


def kernel_files(spec: KernelSource | Mapping[str, Any]) -> dict[str, Path]:
    """The problem files of a source by name; ``problems`` names a subset. A JSONL source has
    none (its file is the pool's input), nor a generated family (FAMILY_FILE is)."""
    spec = _source(spec)
    if spec.path or spec.family:
        return {}
    name, root = spec.name, Path(spec.dir or PROBLEMS_DIR)
    files = sorted(root.glob("*.py"), key=lambda p: p.stem)
    available = {p.stem: p for p in files if not p.name.startswith("_")}
    if not available:
        raise DataError(f"source '{name}': no problem files (*.py) in {root}")
    return {stem: available[stem] for stem in _chosen(spec, available, root)}


def _chosen(
    spec: KernelSource, available: Mapping[str, Any], where: Any, what: str = "problem file"
) -> list[str]:
    """The names ``problems`` picks (default: all), each one available."""
    wanted = spec.problems or list(available)
    missing = [w for w in wanted if w not in available]
    if missing:
        raise DataError(
            f"source '{spec.name}': no {what} for {missing} in {where} (have {len(available)})"
        )
    return wanted


def solution_files(spec: KernelSource | Mapping[str, Any]) -> dict[str, Path]:
    """The reference solutions of a source's problems (the project's own set has them)."""
    spec = _source(spec)
    if spec.dir or spec.path or spec.family:
        return {}
    candidates = {stem: SOLUTIONS_DIR / f"{stem}.py" for stem in kernel_files(spec)}
    return {stem: path for stem, path in candidates.items() if path.exists()}


def _jsonl_problems(spec: KernelSource) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """name -> (where, code, meta) of a JSONL source's rows."""
    rows: dict[str, tuple[str, str, dict[str, Any]]] = {}
    lines: dict[str, int] = {}
    for lineno, line in iter_lines(spec.path):
        row = parse_row(spec.path, lineno, line)
        where = f"source '{spec.name}': {spec.path}:{lineno}"
        code = row.get("code")
        if not isinstance(code, str) or not code.strip():
            raise DataError(
                f"{where}: key 'code' must hold the problem file's text, got "
                f"{'nothing' if code is None else repr(code)[:40]} (row has: "
                f"{', '.join(sorted(row))})"
            )
        name = row.get("name", f"row{lineno}")
        if not isinstance(name, str) or not name.strip():
            raise DataError(f"{where}: key 'name' must be a non-empty string, got {name!r:.40}")
        name = name.strip().removesuffix(".py")
        if name in lines:
            raise DataError(f"{where}: problem name '{name}' is taken by line {lines[name]}")
        lines[name] = lineno
        meta = {k: row[k] for k in ("level", "problem_id") if k in row}
        rows[name] = (f"{where} ({name})", code, meta)
    if not rows:
        raise DataError(f"source '{spec.name}': {spec.path} has no rows")
    return {name: rows[name] for name in _chosen(spec, rows, spec.path, "row named")}


def _problems(spec: KernelSource) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """name -> (where, source text, meta) of every problem of the source."""
    if spec.path:
        return _jsonl_problems(spec)
    if spec.family:
        names = {name: None for name in families.problem_names(spec.family)}
        return {
            name: (
                f"source '{spec.name}': family {spec.family} ({name})",
                families.problem_source(name),
                {"solution": name, "family": spec.family},
            )
            for name in _chosen(spec, names, f"family {spec.family}", "problem")
        }
    return {
        stem: (f"source '{spec.name}': {path}", _read(spec, path), {})
        for stem, path in kernel_files(spec).items()
    }


def _read(spec: KernelSource, path: Path) -> str:
    """A problem file's text as Python reads it (a BOM, CRLF or a coding line are valid)."""
    try:
        return read_python(path)
    except DataError as exc:
        raise DataError(f"source '{spec.name}': {exc}") from None


def kernel_problems(
    spec: KernelSource | Mapping[str, Any],
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(source text, meta) of each problem (a ``Model``, ``get_inputs``, ``get_init_inputs``),
    checked (DataError naming its file or row) and scaled to ``max_input_elements`` when set."""
    spec = _source(spec)
    solutions = solution_files(spec)
    budget = spec.max_input_elements
    for name, (where, src, meta) in _problems(spec).items():
        meta = {"problem": name, **meta, **({"solution": name} if name in solutions else {})}
        if budget is None:
            check_problem(src, where)
            check_inputs(src, where)
        else:
            scaled = scale_problem(src, budget, where)
            src = scaled.src
            if scaled.constants:
                meta["scaled"] = scaled.meta(budget)
        yield src, meta


def problem_count(spec: KernelSource | Mapping[str, Any]) -> int:
    """How many problems a source gives."""
    return len(_problems(_source(spec)))


def reference_solution(
    solution: str, family: str | None = None, *, note: Callable[[Path], Any] = lambda path: None
) -> str:
    """The reference Triton solution a record's meta names: a file of ``solutions/`` (given to
    ``note`` first: a stage passes its ``Notes.add_file``, the file being an input of its job), or
    the template of a generated family."""
    if family:
        return families.solution_source(solution)
    path = SOLUTIONS_DIR / f"{solution}.py"
    note(path)
    return path.read_text(encoding="utf-8")
