"""``stillroom audit``: walk an artifact's provenance back to the raw teacher records and re-hash
everything.

From any artifact (a table, a plot, a checkpoint) the audit follows each sidecar's inputs to their
own sidecars, down to the generation shards and the source files, re-hashing every file once. It
reports:

* ``modified``: an artifact (or one file of a directory) no longer matches its own sidecar's digest;
* ``missing``: an artifact, a file of its manifest, its sidecar or its config snapshot is gone;
* ``stale``: an input recorded in a sidecar has since changed, i.e. the input's own sidecar (or, for
  a source file without one, the file itself) now says another hash: the artifact is out of date;
* ``no provenance``: an input under ``results/`` that has no sidecar, so its origin cannot be
  checked.

An input's sidecar that differs from the one its consumer was built with is ``modified`` (the chain
itself was edited), and so is a sibling output (``heldout.png`` beside ``heldout.md``) that no
longer matches the digest its job recorded, or an environment lock that no longer hashes to its
name. Where the environment the audit runs in differs from a recorded lock, a note says how (not a
problem: the records are what they were).

Paths in sidecars are relative to the Snakemake working directory (a file outside it, such as a
source in the repository when the run is elsewhere, is absolute; so are an older sidecar's config
snapshot and sources), so the audit resolves them against ``root``; by default the root is inferred
from the artifact's own sidecar.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..config import config_hash
from ..config.base import readable
from . import envlock
from .sidecars import changed_records, digest, sidecar_path

SHOWN_PACKAGES = ("torch", "transformers", "trl")  # what decides the numbers; the rest is in JSON
SHORT = 8


@dataclass
class Problem:
    path: str  # the file that is wrong: the artifact, a file inside it, or its sidecar
    kind: str  # modified | missing | stale | no provenance
    detail: str
    input: str | None = None  # for stale: the input that changed


@dataclass
class Node:
    path: str  # as recorded by the consumer (relative to root, or absolute for sources)
    sha256: str | None = None  # current digest, None when the artifact is missing
    stage: str | None = None  # None for a source file (a leaf)
    rule: str | None = None
    config_sha256: str | None = None
    git: dict[str, Any] | None = None
    packages: dict[str, str | None] = field(default_factory=dict)
    files: int | None = None  # a directory's file count
    resolved: list[dict[str, Any]] = field(default_factory=list)  # hub revisions, served models
    params: dict[str, Any] = field(default_factory=dict)  # the job's, as its sidecar records
    repeat: bool = False  # reached before: its subtree is printed once, above
    problems: list[Problem] = field(default_factory=list)
    inputs: list[Node] = field(default_factory=list)


@dataclass
class AuditReport:
    artifact: str
    root: str
    tree: Node
    problems: list[Problem]
    rehashed: int = 0  # distinct artifacts and source files hashed (each once)
    notes: list[str] = field(default_factory=list)  # e.g. how this environment differs

    @property
    def ok(self) -> bool:
        return not self.problems

    def nodes(self) -> list[Node]:
        out, todo = [], [self.tree]
        while todo:
            node = todo.pop()
            out.append(node)
            todo.extend(reversed(node.inputs))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "artifact": self.artifact,
            "root": self.root,
            "ok": self.ok,
            "rehashed": self.rehashed,
            "problems": [asdict(p) for p in self.problems],
            "notes": self.notes,
            "tree": asdict(self.tree),
        }


def _short(sha: str | None) -> str:
    return sha[:SHORT] if sha else "-"


def records_changed(real: Path, prov: dict[str, Any]) -> str:
    """The first record of a changed JSONL file that differs from what its job wrote, by line and
    key, and how many more: '' when its sidecar has no record digests."""
    lines = changed_records(real, prov) if real.is_file() else None
    if not lines:
        return ""
    where = f"line {lines[0]}"
    with open(real, "rb") as fh:
        for n, line in enumerate(fh, 1):
            if n == lines[0]:
                try:
                    where += f" (key {json.loads(line).get('key')})"
                except (ValueError, AttributeError):
                    pass  # not a record any more: its line says where
                break
    more = f" and {len(lines) - 1} more" if len(lines) > 1 else ""
    return f"; record {where}{more} changed"


def modified_detail(real: Path, prov: dict[str, Any], now: str) -> str:
    """A file that no longer hashes to its sidecar: both hashes, and the records that changed."""
    return f"recorded {_short(prov.get('sha256'))}, now {_short(now)}" + records_changed(real, prov)


def _manifest_diff(path: str, recorded: dict[str, str], current: dict[str, str]) -> list[Problem]:
    """Name the very files of a directory that changed, not just the directory."""
    out = []
    for name in sorted(recorded.keys() | current.keys()):
        where = f"{path.rstrip('/')}/{name}"
        if name not in current:
            out.append(Problem(where, "missing", "listed in the recorded manifest, gone now"))
        elif name not in recorded:
            out.append(Problem(where, "modified", "added after the artifact was recorded"))
        elif recorded[name] != current[name]:
            out.append(
                Problem(
                    where,
                    "modified",
                    f"recorded {_short(recorded[name])}, now {_short(current[name])}",
                )
            )
    return out


class Auditor:
    """One walk's state: each file hashed and each sidecar read once, the config snapshots and
    environment locks checked once (``bundle`` checks a bundle's sidecars with it)."""

    def __init__(self, root: Path):
        self.root = root
        # each file hashed once, however often reached
        self.hashes: dict[Path, dict[str, Any] | None] = {}
        self.sidecars: dict[Path, dict[str, Any] | None] = {}
        self.broken: dict[Path, str] = {}
        self.visited: set[Path] = set()
        self.configs: dict[str, Problem | None] = {}
        self.snapshots: dict[str, dict[str, Any]] = {}  # recorded path -> the config it holds
        # environment locks: recorded path -> (sha, the lock or None, its problem)
        self.locks: dict[str, tuple[str, dict[str, Any] | None, Problem | None]] = {}
        self.reported: set[tuple[str, str]] = set()  # (kind, path) already a problem

    def resolve(self, path: str) -> Path:
        return Path(path) if Path(path).is_absolute() else self.root / path

    def digest(self, path: Path) -> dict[str, Any] | None:
        if path not in self.hashes:
            self.hashes[path] = digest(path) if path.exists() else None
        return self.hashes[path]

    def sidecar(self, path: Path) -> dict[str, Any] | None:
        if path not in self.sidecars:
            side = sidecar_path(path)
            try:
                self.sidecars[path] = json.loads(side.read_text()) if side.exists() else None
            except (OSError, ValueError) as exc:
                # reported once by visit(), not raised mid-walk
                self.sidecars[path], self.broken[path] = None, str(exc)
        return self.sidecars[path]

    def under_results(self, path: Path) -> bool:
        return path.resolve().is_relative_to((self.root / "results").resolve())

    def check_config(self, prov: dict[str, Any]) -> Problem | None:
        """The snapshot must still hash to the recorded config hash (once per snapshot)."""
        sha, recorded = prov.get("config_sha256"), prov.get("config_path")
        if not sha or not recorded:
            return None  # run outside Snakemake: nothing was recorded to check
        if recorded not in self.configs:
            # Relative to root; an older sidecar's absolute path, if the tree was moved, is found by
            # its tail under root.
            parts = Path(recorded).parts
            candidates = (
                [self.root.joinpath(*parts[i:]) for i in range(1, len(parts))] + [Path(recorded)]
                if Path(recorded).is_absolute()
                else [self.root / recorded]
            )
            found = next((c for c in candidates if c.is_file()), None)
            if found is None:
                self.configs[recorded] = Problem(recorded, "missing", "config snapshot gone")
            elif config_hash(snapshot := json.loads(found.read_text())) != sha:
                self.configs[recorded] = Problem(
                    str(found), "modified", f"config snapshot no longer hashes to {_short(sha)}"
                )
            else:
                self.configs[recorded] = None
                self.snapshots[recorded] = snapshot
        return self.configs[recorded]

    def check_seed(self, path: str, prov: dict[str, Any]) -> Problem | None:
        """Every job's params carry the config's seed (each stage's job_params), and its sidecar
        repeats it: a seed edited where no consumer hashed the sidecar (the top one) differs from
        its config snapshot."""
        params = prov.get("params") or {}
        snapshot = self.snapshots.get(prov.get("config_path") or "")
        if "seed" not in params or snapshot is None or "seed" not in snapshot:
            return None  # a stage run by hand: no config to hold the seed against
        if params["seed"] == prov.get("seed") == snapshot["seed"]:
            return None
        return Problem(
            str(sidecar_path(path)),
            "modified",
            f"records seed {prov.get('seed')} (params {params['seed']}), its config snapshot "
            f"{prov['config_path']} says {snapshot['seed']}",
        )

    def visit(self, path: str, recorded: dict[str, Any] | None = None, read: bool = False) -> Node:
        """The node for ``path``; ``recorded`` is its entry in the consumer's sidecar (None at the
        top); ``read``: a file the stage read through its params (a source, a model directory),
        which needs no sidecar even under ``results/``."""
        real = self.resolve(path)
        node = Node(path)
        if real in self.visited:
            node.repeat = True
            return node
        self.visited.add(real)
        current = self.digest(real)
        node.sha256 = current and current["sha256"]
        if current and "files" in current:
            node.files = len(current["files"])
        prov = self.sidecar(real)
        if real in self.broken:
            node.problems.append(
                Problem(
                    str(sidecar_path(path)), "modified", f"sidecar unreadable: {self.broken[real]}"
                )
            )
            return node
        if prov is None:
            if current is None:
                node.problems.append(Problem(path, "missing", "file gone"))
            if recorded and recorded.get("provenance"):
                node.problems.append(Problem(recorded["provenance"], "missing", "sidecar gone"))
            elif recorded is None or (self.under_results(real) and not read):
                node.problems.append(
                    Problem(path, "no provenance", "a pipeline artifact without a sidecar")
                )
            return node  # a source file: the consumer compares its hash with the recorded one
        node.stage, node.rule = prov.get("stage"), prov.get("rule")
        node.config_sha256, node.git = prov.get("config_sha256"), prov.get("git")
        node.packages = prov.get("packages") or {}
        node.params = prov.get("params") or {}
        if current is None:
            node.problems.append(
                Problem(path, "missing", "artifact gone (its sidecar is still there)")
            )
        elif current["sha256"] != prov.get("sha256"):
            if "files" in current and "files" in prov:
                node.problems.extend(_manifest_diff(path, prov["files"], current["files"]))
            else:
                node.problems.append(
                    Problem(path, "modified", modified_detail(real, prov, current["sha256"]))
                )
        if problem := self.check_config(prov) or self.check_seed(path, prov):
            node.problems.append(problem)
        if problem := self.check_lock(prov):
            node.problems.append(problem)
        node.resolved = list(prov.get("resolved") or [])
        node.problems += self.siblings(path, real, prov)
        for key, entry in (prov.get("inputs") or {}).items():
            for item in entry if isinstance(entry, list) else [entry]:
                child = self.visit(item["path"], item, read=key == "read")
                node.inputs.append(child)
                if stale := self.stale(path, item):
                    node.problems.append(stale)
                elif changed := self.sidecar_changed(path, item):
                    node.problems.append(changed)
        return node

    def siblings(self, path: str, real: Path, prov: dict[str, Any]) -> list[Problem]:
        """The job's other outputs must still match the digests it recorded for them."""
        out = []
        recorded = prov.get("output_digests") or {}  # absent in older sidecars
        for name, sibling in (prov.get("outputs") or {}).items():
            where = self.resolve(sibling)
            if name not in recorded or where == real:
                continue
            current = self.digest(where)
            if current is None:
                out.append(Problem(sibling, "missing", f"written with {path} by its job, gone now"))
            elif current["sha256"] != recorded[name]:
                out.append(
                    Problem(
                        sibling,
                        "modified",
                        f"written with {path} by its job at {_short(recorded[name])}, "
                        f"now {_short(current['sha256'])}",
                    )
                )
        return out

    def sidecar_changed(self, consumer: str, item: dict[str, Any]) -> Problem | None:
        """The input's sidecar must be the very one ``consumer`` was built with (its artifact being
        unchanged: a changed artifact is ``stale``). Reported once per sidecar."""
        side, recorded = item.get("provenance"), item.get("provenance_sha256")
        if not side or not recorded:
            return None  # no sidecar then, or an older consumer that did not hash it
        real = self.resolve(side)
        if not real.is_file() or ("modified", side) in self.reported:
            return None  # a missing sidecar is reported on its own node
        now = self.digest(real)["sha256"]
        if now == recorded:
            return None
        self.reported.add(("modified", side))
        return Problem(
            side,
            "modified",
            f"differs from the sidecar {consumer} was built with "
            f"(recorded {_short(recorded)}, now {_short(now)})",
            input=item["path"],
        )

    def consumers(self, path: str) -> list[Problem]:
        """The top artifact's sidecar against the one each later job that read it recorded (nothing
        in this walk hashed it: a checkpoint's sidecar is hashed by its merge and evaluation). A
        consumer built from other bytes of it is that consumer's own staleness, not checked here."""
        real, now = self.resolve(path), (self.digest(self.resolve(path)) or {}).get("sha256")
        out = []
        for side in sorted((self.root / "results").rglob("*.prov.json")):
            try:
                prov = json.loads(side.read_text())
            except (OSError, ValueError):
                continue  # an unreadable sidecar is a problem of the walk that reaches it
            for entry in (prov.get("inputs") or {}).values():
                for item in entry if isinstance(entry, list) else [entry]:
                    if self.resolve(item["path"]) != real or item.get("sha256") != now:
                        continue
                    if changed := self.sidecar_changed(prov.get("artifact") or str(side), item):
                        out.append(changed)
        return out

    def check_lock(self, prov: dict[str, Any]) -> Problem | None:
        """The environment lock must still hash to its recorded hash (once per lock)."""
        ref = prov.get("env_lock") or {}
        recorded, sha = ref.get("path"), ref.get("sha256")
        if not recorded or not sha:
            return None  # a stage run by hand, or an older sidecar
        if recorded not in self.locks:
            real = self.resolve(recorded)
            try:
                lock = json.loads(real.read_text())
            except FileNotFoundError:
                self.locks[recorded] = (sha, None, Problem(recorded, "missing", "env lock gone"))
            except (OSError, ValueError) as exc:
                problem = Problem(recorded, "modified", f"env lock unreadable: {exc}")
                self.locks[recorded] = (sha, None, problem)
            else:
                problem = None
                if envlock.lock_hash(lock) != sha:
                    problem = Problem(
                        recorded, "modified", f"env lock no longer hashes to {_short(sha)}"
                    )
                self.locks[recorded] = (sha, None if problem else lock, problem)
        return self.locks[recorded][2]

    def environment_notes(self) -> list[str]:
        """How the environment the audit runs in differs from each recorded lock."""
        notes = []
        for path, (_, lock, _) in sorted(self.locks.items()):
            if lock is None:
                continue
            changes = envlock.diff(lock)
            if changes:
                notes.append(f"environment differs from {path}: " + "; ".join(changes))
        return notes

    def stale(self, consumer: str, item: dict[str, Any]) -> Problem | None:
        """Did the input change after ``consumer`` was built from it? An input with a sidecar is
        judged by what its sidecar says (a tampered file is its own 'modified'), a source by its
        bytes."""
        real = self.resolve(item["path"])
        prov = self.sidecar(real)
        now = prov.get("sha256") if prov else (self.digest(real) or {}).get("sha256")
        if now is None or now == item.get("sha256"):
            return None  # a missing input is reported on its own node
        return Problem(
            consumer,
            "stale",
            f"built from {item['path']} at {_short(item.get('sha256'))}, "
            f"which is now {_short(now)}",
            input=item["path"],
        )


def infer_root(artifact: Path) -> Path | None:
    """The working directory the pipeline ran in: the artifact's path minus the relative path it
    recorded."""
    try:
        recorded = Path(
            str(json.loads(sidecar_path(artifact).read_text()).get("artifact", "")).rstrip("/")
        )
    except (OSError, ValueError, AttributeError):
        return None  # no readable sidecar: the walk reports it
    if not recorded.parts or recorded.is_absolute():
        return None
    real = artifact.resolve()
    if real.parts[-len(recorded.parts) :] != recorded.parts:
        return None
    return Path(*real.parts[: -len(recorded.parts)])


def audit(artifact: str | os.PathLike, root: str | os.PathLike | None = None) -> AuditReport:
    """Walk ``artifact``'s provenance to the raw records. Relative paths are taken from ``root``,
    which defaults to the directory the pipeline ran in (inferred from the sidecar), else the
    current one."""
    if root is not None:
        root = Path(root).resolve()
        path = Path(artifact) if Path(artifact).is_absolute() else root / artifact
    else:
        path = Path(artifact).resolve()
        root = infer_root(path) or Path.cwd()
    shown = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    auditor = Auditor(root)
    tree = auditor.visit(shown)
    tree.problems += auditor.consumers(shown)
    report = AuditReport(shown, str(root), tree, [], rehashed=len(auditor.hashes))
    seen: set[tuple[str, str, str | None]] = set()
    for node in report.nodes():
        for p in node.problems:
            # a file reached as a node and as a sibling output is one problem
            if (p.kind, p.path, p.input) not in seen:
                seen.add((p.kind, p.path, p.input))
                report.problems.append(p)
    report.notes = auditor.environment_notes()
    return report


def _packages(packages: dict[str, str | None]) -> str:
    return " ".join(f"{name} {packages[name]}" for name in SHOWN_PACKAGES if packages.get(name))


def _pins(node: Node) -> str:
    """The hub revisions and served models a stage used, short."""
    out = []
    for r in node.resolved:
        if r.get("served") is not None:
            out.append(f"served {','.join(r['served']) or '-'}")
        elif r.get("id"):
            out.append(f"{r['id']}@{(r.get('revision') or 'unresolved')[:SHORT]}")
        elif r.get("manifest_sha256"):
            out.append(f"{r.get('ref')} manifest {_short(r['manifest_sha256'])}")
    return " ".join(out)


WIDTH = 100  # a terminal's line: a label that would pass it goes on the line below its branch
LEGEND = [
    "legend: PATH [stage: rule] (the job that wrote it; [source]: read, not written by a job)",
    "  sha: its sha256's first 8 hex digits; (N files): a directory, hashed per file",
    "  (see above): reached before, its inputs shown there once",
    "  config/git/packages: as on the 'recorded' line above, unless a line names its own",
    "  !! KIND: a problem, listed with its file under 'problem(s)'",
]


def _recorded(node: Node) -> tuple[str, str, str]:
    """(config, git commit, packages) as a line shows them."""
    git = node.git or {}
    commit = (git.get("commit") or "?")[:7] + ("+dirty" if git.get("dirty") else "")
    return _short(node.config_sha256), commit, _packages(node.packages)


def _common(report: AuditReport) -> tuple[str, str, str] | None:
    """What most stages recorded: said once at the top, not on every line."""
    seen = Counter(_recorded(n) for n in report.nodes() if n.stage and not n.repeat)
    return seen.most_common(1)[0][0] if seen else None


def _label(node: Node, common: tuple[str, str, str] | None) -> str:
    if node.repeat:
        return f"{node.path}  (see above)"
    parts = [node.path]
    if node.stage:
        parts.append(
            f"[{node.stage}]" if node.rule in (None, node.stage) else f"[{node.stage}: {node.rule}]"
        )
    else:
        parts.append("[source]")
    parts.append(
        f"sha {_short(node.sha256)}" + (f" ({node.files} files)" if node.files is not None else "")
    )
    if node.stage and (mine := _recorded(node)) != common:
        names = ("config", "git", "packages")
        parts += [
            f"{n} {v}" for n, v, c in zip(names, mine, common or ("",) * 3, strict=True) if v != c
        ]
    if node.stage:
        parts.append(_pins(node))
    flags = sorted({p.kind for p in node.problems})
    if flags:
        parts.append("!! " + ", ".join(flags).upper())
    return "  ".join(p for p in parts if p)


def format_tree(report: AuditReport) -> str:
    common = _common(report)
    lines: list[str] = [f"audit of {report.artifact}"]
    if common:
        config, commit, packages = common
        lines.append(f"recorded: config {config}, git {commit}, {packages}")

    def walk(node: Node, prefix: str, last: bool, top: bool) -> None:
        label = _label(node, common)
        branch = "" if top else prefix + ("└── " if last else "├── ")
        inner = "" if top else prefix + ("    " if last else "│   ")
        if len(branch) + len(label) <= WIDTH:
            lines.append(branch + label)
        else:  # the path on its branch, the rest below it
            lines.append(branch + node.path)
            rest = label.removeprefix(node.path).strip()
            lines.append(inner + ("│   " if node.inputs else "    ") + rest)
        for i, child in enumerate(node.inputs):
            walk(child, inner, i == len(node.inputs) - 1, False)

    walk(report.tree, "", True, True)
    if report.tree.params:  # the top job's: what a reader of this artifact asks first
        lines += ["", f"params of {report.tree.path}:"]
        shown = ["  " + line for line in readable(report.tree.params).splitlines()]
        lines += [line if len(line) <= WIDTH else line[: WIDTH - 3] + "..." for line in shown]
    if report.problems:
        lines += ["", f"{len(report.problems)} problem(s):"]
        lines += problem_lines(report.problems)
    else:
        lines += [
            "",
            f"ok: {report.rehashed} artifacts re-hashed, nothing modified, missing or stale",
        ]
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines + [""] + LEGEND)


def problem_lines(problems: list[Problem]) -> list[str]:
    """Each problem as its kind and file, its detail below (stderr has each on one line)."""
    return [line for p in problems for line in (f"  {p.kind}: {p.path}", f"    {p.detail}")]


def run(artifact: str, root: str | None = None, as_json: bool = False) -> int:
    """The CLI: the tree (or JSON) on stdout, each problem with its file on stderr; 1 if any."""
    report = audit(artifact, root)
    print(json.dumps(report.to_dict(), indent=2) if as_json else format_tree(report))
    for p in report.problems:
        print(f"stillroom audit: {p.kind}: {p.path}: {p.detail}", file=sys.stderr)
    return 0 if report.ok else 1
