"""``stillroom bundle`` and ``stillroom audit --bundle``: one archive a reviewer can check on a
machine that has none of the raw data.

The bundle of ``results/<experiment>`` holds the tables (CSV, Markdown, LaTeX) and plots, the cost
ledger, the config snapshots, every sidecar of the experiment, the environment locks, the inputs
the tables were built from (the graded evaluation records, the merge choice, for effort and
teacher tables the graded teacher shards), the ``snakemake --report`` HTML and an audit transcript
(the provenance walk of each table and its ``--recompute``), with ``MANIFEST.json`` listing every
file with its sha256, size and kind. Raw generation shards, evaluation samples, datasets and
checkpoints stay out: their sidecars are in, so each is still named with its hash.

It is a zip: a reviewer opens it on any system without tools, a single table or the manifest is
read without extracting the rest, and each member carries its own CRC. Its members sit under one
folder (the archive's stem) holding the experiment at its path in the working directory
(``results/<experiment>/...``), since the sidecars record paths relative to it: the extracted
folder is a root the audit and ``--recompute`` run on as they are. One folder, so unzipping in a
checkout never writes into its ``results/``.

``audit --bundle`` extracts it into a scratch directory and checks every file against the manifest,
every bundled artifact against its sidecar (and the job's other outputs against the digests it
recorded), every recorded input in the bundle against the hash its consumer recorded (the graded
records against the tables' sidecars) and its sidecar against the one the consumer was built with,
the config snapshots and environment locks against their hashes, and recomputes every table from
the bundled graded records. Inputs left out by design are listed as not in the bundle, not failures.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from .. import __version__
from ..io import DataError, atomic_path
from ..provenance.audit import Auditor, Problem, audit, format_tree, infer_root
from ..provenance.sidecars import IGNORED, SUFFIX, git_state, now, sha256_file, sidecar_path
from ..workflow import snakemake_env
from .recompute import SHOWN, TABLE_STAGES, Recomputed, recompute

SCHEMA = "stillroom.review.bundle/1"
MANIFEST = "MANIFEST.json"
TRANSCRIPT = "bundle/audit.txt"
REPORT = "bundle/report.html"
# the workflow beside this package (an editable install, as the Makefile makes it)
SNAKEFILE = Path(__file__).resolve().parent.parent.parent / "Snakefile"
REPORT_TIMEOUT_S = 900
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed member times: the same files make the same members
LEFT_OUT = (
    "raw generation shards, graded teacher shards no table reads, evaluation samples, datasets, "
    "pools, checkpoints and logs: their sidecars are included, so each is named with its sha256"
)
KIND_BY_SUFFIX = {
    ".csv": "table",
    ".md": "table",
    ".tex": "table",
    ".html": "table page",
    ".png": "plot",
}


def _short(sha: str | None) -> str:
    return sha[:8] if sha else "-"


# ------------------------------------------------------------------------------ stillroom bundle


def _locate(exp_dir: str | os.PathLike, root: str | os.PathLike | None) -> tuple[Path, Path]:
    """The experiment directory and the working directory the pipeline ran in, or a clear error."""
    exp = Path(exp_dir)
    if not exp.is_dir():
        raise DataError(
            f"{exp_dir}: not a directory; give an experiment's results directory, "
            "results/<experiment>"
        )
    tables = sorted((exp / "tables").glob(f"*{SUFFIX}")) + sorted((exp / "cost").glob(f"*{SUFFIX}"))
    if not tables:
        raise DataError(
            f"{exp_dir}: not an experiment directory (no table sidecars under {exp / 'tables'}); "
            "give results/<experiment> of a run that has made its tables"
        )
    if root is not None:
        base = Path(root).resolve()
    else:
        artifact = Path(str(tables[0])[: -len(SUFFIX)])
        base = infer_root(artifact.resolve())
        if base is None:
            raise DataError(
                f"{tables[0]}: cannot tell the directory the pipeline ran in from this sidecar; "
                "give --root"
            )
    if not exp.resolve().is_relative_to(base):
        raise DataError(f"{exp_dir}: not under the pipeline's working directory {base}")
    return exp.resolve(), base


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and p.name not in IGNORED)


def _read_sidecar(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable sidecar ({exc})") from None


def _entries(prov: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(input name, recorded entry) of every input a sidecar records."""
    out = []
    for key, entry in (prov.get("inputs") or {}).items():
        out += [(key, e) for e in (entry if isinstance(entry, list) else [entry])]
    return out


def _jobs(sidecars: dict[str, dict[str, Any]]) -> list[str]:
    """One artifact per job among ``sidecars`` (relative artifact path -> sidecar): its CSV, the
    data of record, where it wrote one."""
    jobs: dict[tuple[str, ...], list[str]] = {}
    for artifact, prov in sorted(sidecars.items()):
        key = tuple(sorted((prov.get("outputs") or {artifact: artifact}).values()))
        jobs.setdefault(key, []).append(artifact)
    return [next((a for a in arts if a.endswith(".csv")), arts[0]) for arts in jobs.values()]


def collect(exp: Path, root: Path) -> dict[str, str]:
    """Every file the bundle holds, relative to ``root``, with what it is."""
    rel = lambda p: str(p.relative_to(root))  # noqa: E731
    files: dict[str, str] = {}
    for sub in ("tables", "cost"):
        for p in _files(exp / sub) if (exp / sub).is_dir() else []:
            if not p.name.endswith(SUFFIX):
                files[rel(p)] = KIND_BY_SUFFIX.get(p.suffix, "table output")
    for sub, kind in (("config", "config snapshot"), ("env", "environment lock")):
        files.update({rel(p): kind for p in sorted((exp / sub).glob("*.json"))})
    for side in sorted(exp.rglob(f"*{SUFFIX}")):
        files[rel(side)] = "sidecar"
    for side in sorted((exp / "tables").glob(f"*{SUFFIX}")):
        prov = _read_sidecar(side)
        if prov.get("stage") not in TABLE_STAGES:
            continue
        for key, entry in _entries(prov):
            real = (
                Path(entry["path"]) if Path(entry["path"]).is_absolute() else root / entry["path"]
            )
            # an input outside the working directory cannot sit at its recorded path in the bundle
            if not real.exists() or not real.resolve().is_relative_to(root):
                continue
            kind = "graded records" if key in ("graded", "teacher") else "table input"
            files.update({rel(p): kind for p in _files(real)})
            if sidecar_path(real).is_file():
                files[rel(sidecar_path(real))] = "sidecar"
                files.update(_dev_records(real, root))
    return files


def _dev_records(real: Path, root: Path) -> dict[str, str]:
    """A merge choice's graded dev records (what "chosen on dev" rests on), with their
    sidecars; nothing for another input."""
    prov = _read_sidecar(sidecar_path(real))
    if prov.get("stage") != "select_merge":
        return {}
    out = {}
    for key, entry in _entries(prov):
        path = root / entry["path"]
        if key == "graded" and _inside(entry["path"]) and path.is_file():
            out[str(path.relative_to(root))] = "dev records"
            if sidecar_path(path).is_file():
                out[str(sidecar_path(path).relative_to(root))] = "sidecar"
    return out


def transcript(exp: Path, root: Path) -> tuple[str, list[str]]:
    """``stillroom audit`` on every table and ledger, and ``--recompute`` on every table: the
    text, and each problem found."""
    sidecars = {}
    for sub in ("tables", "cost"):
        for side in sorted((exp / sub).glob(f"*{SUFFIX}")):
            sidecars[str(side.relative_to(root))[: -len(SUFFIX)]] = _read_sidecar(side)
    texts, problems = [], []
    for artifact in _jobs(sidecars):
        walk = audit(artifact, root)
        texts.append(f"$ stillroom audit {artifact}\n{format_tree(walk)}")
        problems += [f"{p.kind}: {p.path}: {p.detail}" for p in walk.problems]
        if sidecars[artifact].get("stage") in TABLE_STAGES:
            try:
                rec = recompute(artifact, root)
            except DataError as exc:
                error = str(exc).replace(f"{root}/", "")  # paths as the sidecars write them
                texts.append(f"$ stillroom audit {artifact} --recompute\nerror: {error}")
                problems.append(f"not recomputable: {error}")
                continue
            texts.append(f"$ stillroom audit {artifact} --recompute\n{rec.text()}")
            problems += [f"differs: {d}" for d in rec.differences]
    return "\n\n".join(texts) + "\n", problems


def _snapshot(exp: Path) -> Path | None:
    """The config snapshot the tables were built under (the newest one if none is named)."""
    snapshots = sorted((exp / "config").glob("*.json"), key=lambda p: p.stat().st_mtime)
    named = Counter(
        Path(_read_sidecar(s).get("config_path") or "").name
        for s in (exp / "tables").glob(f"*{SUFFIX}")
    )
    for name, _ in named.most_common():
        if (exp / "config" / name).is_file():
            return exp / "config" / name
    return snapshots[-1] if snapshots else None


def snakemake_report(exp: Path, root: Path, out: Path) -> dict[str, Any]:
    """``snakemake --report`` of the experiment's config, run in the pipeline's working directory;
    why there is none when it cannot be made."""
    snapshot = _snapshot(exp)
    if snapshot is None:
        return {"included": False, "reason": f"no config snapshot under {exp / 'config'}"}
    if not SNAKEFILE.is_file():
        return {
            "included": False,
            "reason": f"no workflow at {SNAKEFILE} (stillroom is not installed from its checkout)",
        }
    cmd = [sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "--directory", str(root)]
    cmd += ["--configfile", str(snapshot), "--nolock", "--report", str(out)]
    shown = " ".join(cmd)
    try:
        # this interpreter's bin first on PATH: the workflow refuses to parse without `stillroom`
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=REPORT_TIMEOUT_S, env=snakemake_env()
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"included": False, "command": shown, "reason": f"snakemake did not finish: {exc}"}
    if proc.returncode != 0 or not out.is_file():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        return {
            "included": False,
            "command": shown,
            "reason": f"snakemake --report failed (exit {proc.returncode}): {tail}",
        }
    return {"included": True, "path": REPORT, "command": shown}


def _zip(out: Path, top: str, members: dict[str, bytes | Path]) -> None:
    with atomic_path(out) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, content in sorted(members.items()):
            info = zipfile.ZipInfo(f"{top}/{name}", ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            with z.open(info, "w") as fh:
                if isinstance(content, bytes):
                    fh.write(content)
                else:
                    with open(content, "rb") as src:
                        while chunk := src.read(1 << 20):
                            fh.write(chunk)


def write(
    exp_dir: str | os.PathLike,
    out: str | os.PathLike | None = None,
    root: str | os.PathLike | None = None,
    report: bool = True,
) -> tuple[Path, dict[str, Any]]:
    """Write the bundle of ``exp_dir`` (default: ``<experiment>-bundle.zip`` here); the archive
    and its manifest."""
    exp, base = _locate(exp_dir, root)
    out = Path(out) if out else Path(f"{exp.name}-bundle.zip")
    if out.suffix != ".zip":
        raise DataError(f"{out}: a bundle is a zip archive; name it <something>.zip")
    if out.resolve().is_relative_to(exp):
        raise DataError(f"{out}: inside the experiment it bundles; write it elsewhere")
    out.parent.mkdir(parents=True, exist_ok=True)
    members: dict[str, bytes | Path] = {}
    entries = []
    for path, kind in sorted(collect(exp, base).items()):
        members[path] = base / path
        entries.append({"path": path, "kind": kind, "size": (base / path).stat().st_size})
    text, problems = transcript(exp, base)
    members[TRANSCRIPT] = text.encode()
    entries.append({"path": TRANSCRIPT, "kind": "audit transcript", "size": len(text.encode())})
    with tempfile.TemporaryDirectory(prefix="stillroom-bundle-") as tmp:
        made = Path(tmp) / "report.html"
        if report:
            status = snakemake_report(exp, base, made)
        else:
            status = {"included": False, "reason": "not made (--no-report)"}
        if status["included"]:
            members[REPORT] = made.read_bytes()
            entries.append(
                {"path": REPORT, "kind": "snakemake report", "size": len(members[REPORT])}
            )
        for e in entries:
            content = members[e["path"]]
            e["sha256"] = (
                sha256_file(content)
                if isinstance(content, Path)
                else hashlib.sha256(content).hexdigest()
            )
        manifest = {
            "schema": SCHEMA,
            "experiment": exp.name,
            "experiment_dir": str(exp.relative_to(base)),
            "created_at": now(),
            "stillroom": __version__,
            "git": git_state(),
            "report": status,
            "audit": {"ok": not problems, "problems": problems},
            "left_out": LEFT_OUT,
            "files": entries,
        }
        members[MANIFEST] = (json.dumps(manifest, indent=2) + "\n").encode()
        _zip(out, out.name.removesuffix(".zip"), members)
    return out, manifest


def run_bundle(
    exp_dir: str, out: str | None = None, root: str | None = None, report: bool = True
) -> int:
    """The CLI: write the bundle and say what is in it; 1 if the audit of the run it bundles found
    a problem (the bundle is written all the same, its transcript says what)."""
    path, manifest = write(exp_dir, out, root, report)
    kinds = Counter(e["kind"] for e in manifest["files"])
    size = path.stat().st_size
    print(f"wrote {path}: {len(manifest['files'])} files, {size / 1e6:.2f} MB")
    for kind, n in sorted(kinds.items()):
        total = sum(e["size"] for e in manifest["files"] if e["kind"] == kind)
        print(f"  {kind}: {n} files, {total / 1e6:.2f} MB")
    if not manifest["report"]["included"]:
        print(f"  no snakemake report: {manifest['report']['reason']}")
    for p in manifest["audit"]["problems"]:
        print(f"stillroom bundle: {p}", file=sys.stderr)
    return 0 if manifest["audit"]["ok"] else 1


# ------------------------------------------------------------------------ stillroom audit --bundle


@dataclass
class BundleAudit:
    archive: str
    experiment: str
    files: int  # listed in the manifest
    checked: Counter = field(default_factory=Counter)  # what was compared, by what
    problems: list[Problem] = field(default_factory=list)
    not_in_bundle: dict[str, str] = field(default_factory=dict)  # input -> the consumer naming it
    recomputed: list[Recomputed] = field(default_factory=list)
    merge_choices: list[str] = field(default_factory=list)  # each decided again
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "archive": self.archive,
            "experiment": self.experiment,
            "ok": self.ok,
            "files": self.files,
            "checked": dict(self.checked),
            "problems": [asdict(p) for p in self.problems],
            "not_in_bundle": self.not_in_bundle,
            "recomputed": [r.to_dict() for r in self.recomputed],
            "merge_choices": self.merge_choices,
            "notes": self.notes,
        }

    def text(self) -> str:
        c = self.checked
        lines = [
            f"bundle {self.archive}: experiment {self.experiment}, {self.files} files",
            f"  checked: {c['manifest']} files against the manifest, {c['sidecar']} artifacts "
            "against their sidecars,",
            f"  {c['input']} recorded inputs and {c['input sidecar']} input sidecars against their "
            f"consumers' records,",
            f"  {c['config']} config snapshots, {c['lock']} environment locks",
        ]
        lines += [r.text() for r in self.recomputed]
        lines += self.merge_choices
        if self.not_in_bundle:
            lines.append(f"not in bundle (by design): {len(self.not_in_bundle)} recorded inputs")
            shown = sorted(self.not_in_bundle.items())
            lines += [f"  {p} (input of {by})" for p, by in shown[:SHOWN]]
            if len(shown) > SHOWN:
                lines.append(f"  ... {len(shown) - SHOWN} more (--json for all)")
        if self.problems:
            lines.append(f"{len(self.problems)} problem(s):")
            lines += [f"  {p.kind}: {p.path}: {p.detail}" for p in self.problems]
        else:
            lines += [
                "ok: every file matches the manifest, its sidecar and its consumers,",
                "  and every table recomputes from the bundled records",
            ]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _open(archive: Path) -> tuple[zipfile.ZipFile, str, dict[str, Any]]:
    """The archive, its top folder and its manifest, or a clear error."""
    if not archive.is_file():
        raise DataError(f"{archive}: no such file; give a bundle written by `stillroom bundle`")
    if not zipfile.is_zipfile(archive):
        raise DataError(
            f"{archive}: not a bundle: not a zip archive (`stillroom bundle` writes one)"
        )
    z = zipfile.ZipFile(archive)
    try:
        names = [i.filename for i in z.infolist() if not i.is_dir()]
        tops = {n.split("/", 1)[0] for n in names}
        top = next(iter(tops)) if len(tops) == 1 else None
        if top is None or f"{top}/{MANIFEST}" not in names:
            raise DataError(f"{archive}: not a bundle: no {MANIFEST} in one top-level folder")
        for n in names:
            if PurePosixPath(n).is_absolute() or ".." in PurePosixPath(n).parts or "\\" in n:
                raise DataError(f"{archive}: member {n} would land outside the bundle's folder")
        where = f"{archive}: {top}/{MANIFEST}"
        try:
            manifest = json.loads(z.read(f"{top}/{MANIFEST}"))
        except (ValueError, zipfile.BadZipFile) as exc:
            raise DataError(f"{where}: unreadable ({exc})") from None
        if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
            raise DataError(f"{where}: not a {SCHEMA} manifest")
        files = manifest.get("files")
        if not isinstance(files, list) or not all(
            isinstance(e, dict) and isinstance(e.get("path"), str) for e in files
        ):
            raise DataError(f"{where}: 'files' must be a list of entries with a 'path'")
    except BaseException:
        z.close()
        raise
    return z, top, manifest


def audit_bundle(archive: str | os.PathLike) -> BundleAudit:
    """Extract ``archive`` into a scratch directory and check it as the module docstring says."""
    z, top, manifest = _open(Path(archive))
    with z, tempfile.TemporaryDirectory(prefix="stillroom-bundle-audit-") as tmp:
        present, damaged = set(), []
        for info in z.infolist():
            name = info.filename.removeprefix(f"{top}/")
            if info.is_dir() or name == MANIFEST:
                continue
            try:
                z.extract(info, tmp)
            except (zipfile.BadZipFile, EOFError, OSError) as exc:
                # bytes changed inside the archive (its CRC no longer matches): named, not used
                (Path(tmp) / info.filename).unlink(missing_ok=True)
                damaged.append(Problem(name, "modified", f"unreadable in the archive: {exc}"))
                continue
            present.add(name)
        return _check(str(archive), Path(tmp) / top, present, manifest, damaged)


def _inside(recorded: str) -> bool:
    """A recorded path that can name a file of the bundle: relative, never climbing out of it (a
    forged sidecar must not make the audit read the reviewer's files)."""
    return not Path(recorded).is_absolute() and ".." not in Path(recorded).parts


def _held(root: Path, recorded: str) -> str:
    """``recorded`` as a path of the bundle: itself when it is inside, else its longest tail that
    is a file of the bundle, else that tail anyway (a file the checks then find missing)."""
    if _inside(recorded):
        return recorded
    path = Path(recorded)
    parts = [p for p in path.parts if p not in (path.anchor, "..")]
    tails = [str(Path(*parts[i:])) for i in range(len(parts))]
    return next((t for t in tails if (root / t).is_file()), tails[0] if tails else ".")


def _check(
    archive: str, root: Path, present: set[str], manifest: dict[str, Any], damaged: list[Problem]
) -> BundleAudit:
    listed = {e["path"]: e for e in manifest["files"]}
    report = BundleAudit(archive, str(manifest.get("experiment")), len(listed), problems=damaged)
    _check_manifest(report, root, present, listed, {p.path for p in damaged})
    sidecars = _check_sidecars(report, root, present)
    # a listed file that is gone or damaged is a problem already, not a file left out by design
    report.not_in_bundle = {p: by for p, by in report.not_in_bundle.items() if p not in listed}
    _recompute_tables(report, root, sidecars)
    _check_merge_choices(report, root, sidecars)
    return report


def _check_manifest(
    report: BundleAudit,
    root: Path,
    present: set[str],
    listed: dict[str, dict[str, Any]],
    damaged: set[str],
) -> None:
    """Every listed file there with its bytes; nothing there that is not listed."""
    for path, e in sorted(listed.items()):
        if path in damaged:
            continue
        if path not in present:
            report.problems.append(
                Problem(path, "missing", "listed in the manifest, not in the archive")
            )
            continue
        report.checked["manifest"] += 1
        sha = sha256_file(root / path)
        if sha != e.get("sha256"):
            detail = f"manifest says {_short(e.get('sha256'))}, now {_short(sha)}"
            report.problems.append(Problem(path, "modified", detail))
    for path in sorted((present | damaged) - listed.keys()):
        report.problems.append(Problem(path, "unlisted", "in the archive but not in its manifest"))


def _check_sidecars(report: BundleAudit, root: Path, present: set[str]) -> dict[str, dict]:
    """Each bundled artifact against its sidecar and the job's other outputs; every sidecar's
    inputs in the bundle against the hashes it recorded, and their sidecars against the ones it was
    built with (for a left-out artifact too: the chain of records holds without the data); config
    snapshots and locks. The sidecars of the bundled artifacts, by artifact."""
    add = report.problems.append
    auditor = Auditor(root)
    chain: dict[str, dict[str, Any]] = {}
    for side in sorted(p for p in present if p.endswith(SUFFIX)):
        try:
            chain[side[: -len(SUFFIX)]] = json.loads((root / side).read_text())
        except (OSError, ValueError) as exc:
            add(Problem(side, "modified", f"sidecar unreadable: {exc}"))
    changed: set[str] = set()  # inputs already named, by their first consumer
    for artifact, prov in chain.items():
        bundled = artifact in present
        if bundled:
            report.checked["sidecar"] += 1
            sha = auditor.digest(root / artifact)["sha256"]
            if sha != prov.get("sha256"):
                detail = f"its sidecar records {_short(prov.get('sha256'))}, now {_short(sha)}"
                add(Problem(artifact, "modified", detail))
            for name, sibling in (prov.get("outputs") or {}).items():
                recorded = (prov.get("output_digests") or {}).get(name)
                if sibling == artifact or recorded is None:
                    continue
                if sibling not in present:
                    report.not_in_bundle.setdefault(sibling, artifact)
                elif (sha := auditor.digest(root / sibling)["sha256"]) != recorded:
                    detail = f"written with {artifact} at {_short(recorded)}, now {_short(sha)}"
                    add(Problem(sibling, "modified", detail))
        for key, entry in _entries(prov):
            path = entry["path"]
            if not _inside(path) or (path not in present and not (root / path).is_dir()):
                # a source read through params is recorded, never bundled
                if bundled and key != "read":
                    report.not_in_bundle.setdefault(path, artifact)
            else:
                report.checked["input"] += 1
                sha = auditor.digest(root / path)["sha256"]
                if sha != entry.get("sha256"):
                    if path not in changed:
                        changed.add(path)
                        detail = (
                            f"{artifact} was built from it at {_short(entry.get('sha256'))}, "
                            f"now {_short(sha)}"
                        )
                        add(Problem(path, "modified", detail, input=path))
                    continue  # a changed input: its sidecar is judged on its own
            side = entry.get("provenance")
            # a sidecar outside the working directory was never bundled: nothing outside is read
            if side and _inside(side) and (root / side).is_file():
                report.checked["input sidecar"] += 1
                if problem := auditor.sidecar_changed(artifact, entry):
                    add(problem)
        # the snapshot and lock as the bundle holds them (an older sidecar's absolute snapshot
        # path by its tail), so nothing outside the bundle is read
        held = dict(prov)
        if prov.get("config_path"):
            held["config_path"] = _held(root, prov["config_path"])
        if (prov.get("env_lock") or {}).get("path"):
            held["env_lock"] = {**prov["env_lock"], "path": _held(root, prov["env_lock"]["path"])}
        for check in (auditor.check_config, auditor.check_lock):
            # each snapshot and lock is checked once: its problem comes back for every sidecar
            if (problem := check(held)) and problem not in report.problems:
                add(problem)
    report.checked["config"] = len(auditor.configs)
    report.checked["lock"] = len(auditor.locks)
    report.notes = auditor.environment_notes()
    return {a: p for a, p in chain.items() if a in present}


def _recompute_tables(report: BundleAudit, root: Path, sidecars: dict[str, dict]) -> None:
    """Every table built again from the bundled records; each cell that differs named."""
    tables = {a: p for a, p in sidecars.items() if p.get("stage") in TABLE_STAGES}
    for artifact in _jobs(tables):
        absent = [
            e["path"]
            for _, e in _entries(tables[artifact])
            if not _inside(e["path"]) or not (root / e["path"]).exists()
        ]
        if absent:
            more = f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""
            detail = f"its input {absent[0]} is not in the bundle{more}"
            report.problems.append(Problem(artifact, "not recomputable", detail))
            continue
        try:
            rec = recompute(artifact, root)
        except DataError as exc:
            # the scratch directory means nothing to the reader: paths as the bundle holds them
            detail = str(exc).replace(f"{root}/", "")
            report.problems.append(Problem(artifact, "not recomputable", detail))
            continue
        report.recomputed.append(rec)
        report.problems += [
            Problem(
                d.file,
                "differs",
                f"{d.row}: {d.column}: written {d.written}, recomputed {d.recomputed}",
            )
            for d in rec.differences
        ]


def _check_merge_choices(report: BundleAudit, root: Path, sidecars: dict[str, dict]) -> None:
    """Each bundled merge choice decided again from its bundled dev records."""
    from ..stages.merge import SelectParams, decide

    for artifact, prov in sorted(sidecars.items()):
        if prov.get("stage") != "select_merge":
            continue
        graded = {
            e["name"]: str(root / e["path"])
            for key, e in _entries(prov)
            if key == "graded" and _inside(e["path"])
        }
        if not graded or not all(Path(p).is_file() for p in graded.values()):
            detail = "its dev records are not in the bundle"
            report.problems.append(Problem(artifact, "not recomputable", detail))
            continue
        written = json.loads((root / artifact).read_text())
        chosen, accuracy, _ = decide(graded, SelectParams.parse(prov.get("params") or {}))
        shown = ", ".join(f"{m} {a:.3f}" for m, a in sorted(accuracy.items()))
        report.merge_choices.append(
            f"merge choice {artifact}\n  {chosen} chosen on {written.get('benchmark')} by "
            f"{written.get('select_by')}, decided again from the bundled dev records ({shown})"
        )
        if chosen != written.get("selected") or accuracy != written.get("accuracy"):
            detail = (
                f"says {written.get('selected')} ({written.get('accuracy')}), its dev records "
                f"give {chosen} ({accuracy})"
            )
            report.problems.append(Problem(artifact, "differs", detail))


def run_audit(archive: str, as_json: bool = False) -> int:
    """The CLI: the report (or JSON) on stdout, each problem with its file on stderr; 1 if any."""
    report = audit_bundle(archive)
    print(json.dumps(report.to_dict(), indent=2, default=str) if as_json else report.text())
    for p in report.problems:
        print(f"stillroom audit: {p.kind}: {p.path}: {p.detail}", file=sys.stderr)
    return 0 if report.ok else 1
