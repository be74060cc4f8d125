"""``stillroom regenerate results/<experiment>``: the tables built again from a results tree that
was copied anywhere or unpacked from a bundle, by the workflow's table rules and no other job.

A copied tree has new mtimes and no Snakemake metadata, so a plain ``snakemake`` plans every job
from the pool again. The sidecars say what each table was built from, so first every input of
every table is checked against them: its bytes against its own sidecar and against the hash the
table recorded, its sidecar against the one the table was built with. A mismatch is refused,
naming the file. Then Snakemake runs on the tables' targets with only the table rules allowed
(``--allowed-rules``: every other rule's files are taken as they are, never planned) and those
rules forced (``--forcerun``). Driving Snakemake, rather than calling the stages directly, keeps
one definition of a table: the same rules, params (from the run's config snapshot), logs and
sidecars as the run, and the workflow's current table code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from ..io import DataError, read_json
from ..provenance.audit import Auditor, Problem, modified_detail
from ..provenance.sidecars import SUFFIX
from ..workflow import snakemake_command, snakemake_env
from .recompute import TABLE_STAGES


def _short(sha: str | None) -> str:
    return sha[:8] if sha else "-"


def table_jobs(exp: Path, root: Path) -> dict[str, dict[str, Any]]:
    """One sidecar per table job of ``exp`` (its first output, relative to ``root``)."""
    jobs: dict[tuple[str, ...], tuple[str, dict[str, Any]]] = {}
    for side in sorted((exp / "tables").glob(f"*{SUFFIX}")):
        prov = read_json(side)
        if prov.get("stage") in TABLE_STAGES:
            outputs = tuple(sorted((prov.get("outputs") or {}).values()))
            artifact = str(side.relative_to(root))[: -len(SUFFIX)]
            jobs.setdefault(outputs, (artifact, prov))
    if not jobs:
        raise DataError(
            f"{exp}: no table sidecars under {exp / 'tables'}; give results/<experiment> of a run "
            "that made its tables"
        )
    return dict(jobs.values())


def _items(prov: dict[str, Any]) -> list[dict[str, Any]]:
    """Every input entry a sidecar records."""
    out = []
    for entry in (prov.get("inputs") or {}).values():
        out += entry if isinstance(entry, list) else [entry]
    return out


def verify(root: Path, jobs: dict[str, dict[str, Any]]) -> list[Problem]:
    """Every recorded input of every table job against its sidecar and the table's record."""
    auditor = Auditor(root)
    problems: list[Problem] = []
    for artifact, prov in jobs.items():
        for item in _items(prov):
            path, real = item["path"], auditor.resolve(item["path"])
            now, own = auditor.digest(real), auditor.sidecar(real)
            if now is None:
                problems.append(Problem(path, "missing", f"an input of {artifact}, gone"))
            elif own is not None and own.get("sha256") != now["sha256"]:
                problems.append(
                    Problem(path, "modified", modified_detail(real, own, now["sha256"]))
                )
            elif now["sha256"] != item.get("sha256"):
                detail = (
                    f"{artifact} was built from it at {_short(item.get('sha256'))}, "
                    f"now {_short(now['sha256'])}"
                )
                problems.append(Problem(path, "modified", detail, input=path))
            elif changed := auditor.sidecar_changed(artifact, item):
                problems.append(changed)
    unique = {(p.kind, p.path): p for p in problems}  # an input of several tables: named once
    return list(unique.values())


def snapshot(root: Path, jobs: dict[str, dict[str, Any]]) -> Path:
    """The config snapshot the tables were built under (one for all of them)."""
    named = Counter(prov.get("config_path") for prov in jobs.values())
    if None in named or len(named) != 1:
        raise DataError(
            "the tables were not built under one config snapshot (their sidecars name "
            f"{', '.join(sorted(str(n) for n in named))}); regenerate needs one"
        )
    (recorded,) = named
    path = Path(recorded) if Path(recorded).is_absolute() else root / recorded
    if not path.is_file():
        raise DataError(f"{recorded}: the tables' config snapshot is gone")
    return path


def command(root: Path, jobs: dict[str, dict[str, Any]], cores: int) -> list[str]:
    """Snakemake on the tables' outputs, only the table rules allowed, and those forced."""
    rules = sorted({prov.get("rule") or prov["stage"] for prov in jobs.values()})
    targets = sorted(
        {out for prov in jobs.values() for out in (prov.get("outputs") or {}).values()}
    )
    # the rule lists take every word after them: the targets come first
    args = ["--cores", str(cores), *targets, "--allowed-rules", *rules, "--forcerun", *rules]
    return snakemake_command(root, *args, configfiles=[snapshot(root, jobs)])


def run(exp_dir: str, root: str | None = None, cores: int = 2, dry_run: bool = False) -> int:
    """The CLI: verify, then rebuild; 1 naming each input that does not match its records."""
    from .bundle import _locate

    exp, base = _locate(exp_dir, root)
    jobs = table_jobs(exp, base)
    problems = verify(base, jobs)
    for p in problems:
        print(f"stillroom regenerate: {p.kind}: {p.path}: {p.detail}", file=sys.stderr)
    if problems:
        print(
            f"stillroom regenerate: refused: {len(problems)} input(s) of the tables do not match "
            "their records (`stillroom audit <table>` walks the whole chain)",
            file=sys.stderr,
        )
        return 1
    n = len({item["path"] for prov in jobs.values() for item in _items(prov)})
    print(f"verified the {n} inputs of {len(jobs)} table jobs against their sidecars")
    cmd = command(base, jobs, cores) + (["--dry-run"] if dry_run else [])
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=snakemake_env(os.environ)).returncode
