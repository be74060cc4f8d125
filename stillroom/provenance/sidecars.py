"""Provenance sidecars: ``<artifact>.prov.json`` beside every artifact.

A sidecar names the stage and rule, every input with its sha256 (directories: a manifest of
per-file hashes), the path of the input's own sidecar and that sidecar's sha256, the files a stage
read through its params (local prompt sources, problem files, model directories), the resolved
revision of every hub dataset and model and the teacher's served model, the digests of the job's
other outputs, the params, the resolved config's hash, the code commit with a hash of its
uncommitted diff and its untracked files, the environment lock (``envlock``) by hash, host, SLURM
job, times, seed and stage metrics. ``audit`` walks these links from a table back to the raw teacher
records and re-hashes each file.

Paths under the working directory are stored relative to it, so a results tree can be moved.
Nothing secret is written: only an allowlist of environment variables is kept, never one whose name
looks like a credential or is a teacher's ``api_key_env``; params under credential-like keys are
redacted, and the value of any such variable is scrubbed from whatever else is written.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
import re
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..io import DataError, read_json, write_json

SCHEMA = "stillroom.provenance.sidecars/2"
PACKAGES = (
    "stillroom",
    "torch",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "tokenizers",
    "safetensors",
    "math-verify",
    "numpy",
    "scipy",
    "snakemake",
)
# Credential-like names (api_key, HF_TOKEN, password, ...), but not counts such as max_tokens.
SECRET = re.compile(
    r"api[_-]?key|secret|passw(or)?d|credential|authorization|(^|[_-])token$|^token", re.I
)
# Environment variables: stricter, any of these words anywhere in the name (MY_TOKEN_FILE too).
SECRET_ENV = re.compile(r"key|token|secret|passw|credential|auth|cookie", re.I)
# The environment variables recorded, by exact name: what shapes a job (the project's partitions,
# the GPUs it sees, its threads, its SLURM job) and whether the hub was reachable. Anything else,
# credentials above all, is never written. (STILLROOM_CONFIG and STILLROOM_WORKFLOW are recorded as
# config_path, relative, and git.)
ENV_ALLOWED = frozenset(
    {
        "STILLROOM_GPU_PARTITION",
        "STILLROOM_CPU_PARTITION",
        "CUDA_VISIBLE_DEVICES",
        "OMP_NUM_THREADS",
        "TOKENIZERS_PARALLELISM",
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "SLURM_JOB_ID",
        "SLURM_ARRAY_JOB_ID",
        "SLURM_ARRAY_TASK_ID",
        "SLURM_JOB_NODELIST",
        "SLURM_NNODES",
        "SLURM_JOB_PARTITION",
    }
)
SUFFIX = ".prov.json"
# Snakemake marks finished directory outputs with it after the job
IGNORED = {".snakemake_timestamp"}
HEX40 = re.compile(r"^[0-9a-f]{40}$")
REDACTED = "<redacted>"


def sidecar_path(artifact: str | os.PathLike) -> Path:
    return Path(str(artifact).rstrip("/") + SUFFIX)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


# Files whose lines are records: their sidecar says how many the job wrote (``records``).
RECORDS = (".jsonl",)


def _scan(path: str | os.PathLike, h: Any = None, chunk: int = 1 << 20) -> int:
    """Lines of a file, a last one without its newline included (``h``: also hashed)."""
    n, last = 0, b"\n"
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            if h is not None:
                h.update(block)
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def count_records(path: str | os.PathLike) -> int:
    """Records of a JSONL file: its lines, one record each as ``write_jsonl`` writes them."""
    return _scan(path)


def _file_digest(path: Path) -> dict[str, Any]:
    """sha256 and size of a file, and for a JSONL file its records, in one pass."""
    h = hashlib.sha256()
    lines = _scan(path, h)
    out: dict[str, Any] = {"sha256": h.hexdigest(), "bytes": path.stat().st_size}
    if path.name.endswith(RECORDS):
        out["records"] = lines
    return out


# Each record's hash, short, in a JSONL artifact's sidecar: the file's sha256 decides whether it
# changed, these only say which record did (``changed_records``).
RECORD_SHA = 16


def record_digests(path: str | os.PathLike) -> list[str]:
    """The short sha256 of each line of a JSONL file (its trailing newline excluded)."""
    with open(path, "rb") as fh:
        return [hashlib.sha256(line.rstrip(b"\n")).hexdigest()[:RECORD_SHA] for line in fh]


def changed_records(path: str | os.PathLike, prov: Mapping[str, Any]) -> list[int] | None:
    """The 1-based lines of ``path`` that differ from what its job wrote (a line added or cut
    included), by its sidecar's record digests; None when the sidecar has none (an older one)."""
    recorded = prov.get("record_sha256")
    if recorded is None:
        return None
    now = record_digests(path)
    return [
        i + 1 for i in range(max(len(now), len(recorded))) if now[i : i + 1] != recorded[i : i + 1]
    ]


def _manifest(path: Path) -> list[Path]:
    return [p for p in sorted(path.rglob("*")) if p.is_file() and p.name not in IGNORED]


def digest(path: str | os.PathLike) -> dict[str, Any]:
    """sha256 of a file with its size (and a JSONL file's records), or for a directory a manifest
    of per-file hashes, a hash over it and each file's size (``sizes``, which a consumer compares
    before it reads the directory)."""
    path = Path(path)
    if path.is_dir():
        listed = _manifest(path)
        files = {str(p.relative_to(path)): sha256_file(p) for p in listed}
        total = hashlib.sha256(
            "".join(f"{k}\0{v}\n" for k, v in files.items()).encode()
        ).hexdigest()
        sizes = {str(p.relative_to(path)): p.stat().st_size for p in listed}
        return {"sha256": total, "files": files, "sizes": sizes}
    return _file_digest(path)


def _few(names: list[str], shown: int = 5) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def check_input(path: str | os.PathLike) -> None:
    """Stop before a stage reads ``path`` when it is not what its job wrote, as far as cheap checks
    tell: a JSONL file's records and a file's size against its sidecar, a directory's file names and
    sizes against the sidecar's manifest. A file without a sidecar (a user's own data) or a
    missing one (the stage says so) is not checked; the hashes are compared by ``audit``."""
    path = Path(path)
    side = sidecar_path(path)
    if not path.exists() or not side.is_file():
        return
    prov = read_json(side)
    if not isinstance(prov, dict) or "sha256" not in prov:
        raise DataError(f"{side}: not a provenance sidecar (no 'sha256' of its artifact)")
    fix = "it was cut short or changed since; delete it so the workflow builds it again"
    if path.is_dir() != ("files" in prov):
        kind = "a directory" if "files" in prov else "a file"
        raise DataError(f"{path}: its sidecar {side} describes {kind}; {fix}")
    if path.is_dir():
        listed = {str(p.relative_to(path)): p for p in _manifest(path)}
        missing = sorted(set(prov["files"]) - set(listed))
        extra = sorted(set(listed) - set(prov["files"]))
        if missing or extra:
            parts = [
                f"{label} {_few(names)}"
                for label, names in (("lacks", missing), ("has", extra))
                if names
            ]
            raise DataError(
                f"{path}: {len(listed)} files, but its sidecar {side} lists {len(prov['files'])} "
                f"(it {' and '.join(parts)}); {fix}"
            )
        for name, size in (prov.get("sizes") or {}).items():
            if (now := listed[name].stat().st_size) != size:
                raise DataError(
                    f"{path}: {name} is {now} bytes, but its sidecar {side} says its job wrote "
                    f"{size}; {fix}"
                )
        return
    if "records" in prov and (now := count_records(path)) != prov["records"]:
        raise DataError(
            f"{path}: {now} records, but its sidecar {side} says its job wrote {prov['records']}; "
            f"{fix}"
        )
    if "bytes" in prov and (size := path.stat().st_size) != prov["bytes"]:
        raise DataError(
            f"{path}: {size} bytes, but its sidecar {side} says its job wrote {prov['bytes']}; "
            f"{fix}"
        )


def relative(path: str | os.PathLike) -> str:
    """``path`` relative to the working directory when it lies under it (so the results tree can be
    moved and still audited), else as given."""
    p = Path(path)
    if p.is_absolute():
        try:
            return str(p.resolve().relative_to(Path.cwd().resolve()))
        except ValueError:
            return str(p)
    return str(p)


def redact(obj: Any) -> Any:
    """Copy of params with every value under a credential-like key replaced."""
    if isinstance(obj, Mapping):
        return {
            k: (REDACTED if SECRET.search(str(k)) and not str(k).endswith("_env") else redact(v))
            for k, v in obj.items()
        }
    if isinstance(obj, list | tuple):
        return [redact(v) for v in obj]
    return obj


def key_variables(params: Any) -> set[str]:
    """The environment variables named by ``*_env`` keys of params (a teacher's ``api_key_env``)."""
    if isinstance(params, Mapping):
        found = {
            v for k, v in params.items() if str(k).endswith("_env") and isinstance(v, str) and v
        }
        return found.union(*(key_variables(v) for v in params.values()))
    if isinstance(params, list | tuple):
        return set().union(*(key_variables(v) for v in params))
    return set()


def _secret_values(names: set[str]) -> list[str]:
    """Values of credential variables in the environment, longest first (short values would match
    by accident; a path, such as a credentials file's, is not the secret)."""
    values = {
        v
        for k, v in os.environ.items()
        if (k in names or SECRET_ENV.search(k)) and len(v) >= 8 and not v.startswith(os.sep)
    }
    return sorted(values, key=len, reverse=True)


def scrub(obj: Any, secrets: list[str]) -> Any:
    """Copy of ``obj`` with every occurrence of a secret value in a string replaced."""
    if not secrets:
        return obj
    if isinstance(obj, str):
        for s in secrets:
            obj = obj.replace(s, REDACTED)
        return obj
    if isinstance(obj, Mapping):
        return {scrub(k, secrets): scrub(v, secrets) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [scrub(v, secrets) for v in obj]
    return obj


# Where a workflow run tells its jobs the snapshot of its resolved config and the workflow's
# directory (rules/common.smk).
CONFIG_ENV = "STILLROOM_CONFIG"
WORKFLOW_ENV = "STILLROOM_WORKFLOW"


@dataclass(frozen=True)
class Job:
    """What a workflow job knows of itself: its rule, the snapshot of the resolved config it ran
    under and the workflow's directory, whose git state is recorded (the last two from
    ``CONFIG_ENV`` and ``WORKFLOW_ENV`` when the CLI is not given them)."""

    rule: str | None = None
    config_path: str | None = None
    workflow: str | None = None

    @functools.cached_property
    def config_sha256(self) -> str | None:
        if not self.config_path:
            return None
        from ..config import config_hash

        return config_hash(read_json(self.config_path))

    @property
    def run_dir(self) -> Path | None:
        """``results/<experiment>``: the config snapshot lives in its ``config/`` (common.smk)."""
        return Path(self.config_path).parent.parent if self.config_path else None


@functools.cache
def git_state(repo: str | None = None) -> dict[str, Any] | None:
    """Commit of the workflow's repository (else of this package's) and, when the checkout differs
    from it, ``dirty``: the sha256 of ``git diff HEAD`` and the untracked (not ignored) files."""
    repo = repo or str(Path(__file__).resolve().parent.parent.parent)

    def git(*args: str) -> bytes:
        return subprocess.run(
            ["git", "-C", repo, *args], capture_output=True, check=True, timeout=20
        ).stdout

    try:
        commit = git("rev-parse", "HEAD").decode().strip()
        diff = git("diff", "HEAD", "--binary")
        untracked = sorted(
            n
            for n in git("ls-files", "--others", "--exclude-standard", "-z").decode().split("\0")
            if n
        )
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = (
        {"diff_sha256": hashlib.sha256(diff).hexdigest() if diff else None, "untracked": untracked}
        if diff or untracked
        else None
    )
    return {"commit": commit, "dirty": dirty}


@functools.cache
def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def environment(excluded: set[str] = frozenset()) -> dict[str, str]:
    """The allowlisted environment variables that are set, less any credential-like name or one in
    ``excluded`` (the variables that hold a teacher's key)."""
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if k in ENV_ALLOWED and k not in excluded and not SECRET_ENV.search(k)
    }


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def hub_cache() -> Path:
    from huggingface_hub import constants

    return Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE)


def _cache_folder(repo_id: str, repo_type: str) -> Path:
    return hub_cache() / f"{repo_type}s--{repo_id.replace('/', '--')}"


def hub_revision(repo_id: str, repo_type: str = "model", revision: str | None = None) -> dict:
    """The commit sha ``revision`` (a branch or tag; default main) of a hub repository resolves to:
    a sha as given, else the ref the local hub cache holds (what a load just used), else asked of
    the hub unless offline. ``{"revision": sha | None, "via": how, "error"?: why not}``."""
    if revision and HEX40.match(revision):
        return {"revision": revision, "via": "pinned"}
    ref = _cache_folder(repo_id, repo_type) / "refs" / (revision or "main")
    if ref.is_file():
        sha = ref.read_text().strip()
        if HEX40.match(sha):
            return {"revision": sha, "via": "cache"}
    from huggingface_hub import HfApi, constants

    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
        return {"revision": None, "via": "offline", "error": f"no cached ref {ref}"}
    try:
        info = HfApi().repo_info(repo_id, repo_type=repo_type, revision=revision)
    except Exception as exc:  # network, auth, not found: recorded, never fatal
        return {"revision": None, "via": "hub", "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"revision": info.sha, "via": "hub"}


def _snapshot(path: Path) -> tuple[str, str, str] | None:
    """(repo type, repo id, sha) of a directory inside a hub cache snapshot
    (``<type>s--org--name/snapshots/<sha>/``), else None."""
    parts = path.resolve().parts
    for i in range(len(parts) - 2):
        if parts[i + 1] == "snapshots" and HEX40.match(parts[i + 2]) and "--" in parts[i]:
            kind, _, name = parts[i].partition("--")
            return kind.rstrip("s"), name.replace("--", "/"), parts[i + 2]
    return None


def describe_model(ref: str, role: str, *, revision: str | None = None) -> dict[str, Any]:
    """A model as used: a hub cache snapshot directory by its repository and commit; another local
    directory by a manifest hash of its files' names and sizes (cheap for a teacher's weights of
    hundreds of GB; a local student is hashed in full by ``Notes.add_model``); a hub id by the
    commit its revision resolves to (``revision``: a sha already known, e.g. a config's
    ``_commit_hash``)."""
    path = Path(ref)
    if path.exists():
        snap = _snapshot(path)
        if snap:
            return {"role": role, "ref": relative(ref), "id": snap[1], "revision": snap[2]}
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        listing = "".join(
            f"{p.relative_to(path) if path.is_dir() else p.name}\0{p.stat().st_size}\n"
            for p in files
        )
        return {
            "role": role,
            "ref": relative(ref),
            "manifest_sha256": hashlib.sha256(listing.encode()).hexdigest(),
        }
    if revision and HEX40.match(revision):
        return {"role": role, "id": ref, "revision": revision, "via": "loaded"}
    return {"role": role, "id": ref, **hub_revision(ref, "model", revision)}


# --- what a stage read besides its declared inputs ------------------------------------------------
@dataclass
class Notes:
    """What one job read besides its declared inputs: noted where it is read (a source file, a hub
    dataset, a model, the teacher's server) into the object the CLI makes for that job and hands
    to its stage, and written into the sidecars of the job's outputs (``write_sidecars``)."""

    read: dict[str, None] = field(default_factory=dict)  # paths, in the order first noted
    resolved: list[dict[str, Any]] = field(default_factory=list)

    def add_file(self, path: str | os.PathLike) -> None:
        """A local file or directory the stage read through its params: hashed as an input."""
        self.read.setdefault(str(Path(path)), None)

    def add_resolved(self, entry: Mapping[str, Any]) -> None:
        """Something the stage used that is not a local file: a hub dataset or model at its
        resolved revision, a teacher's served model."""
        entry = dict(entry)
        if entry not in self.resolved:
            self.resolved.append(entry)

    def add_model(self, ref: str, role: str, *, revision: str | None = None) -> None:
        """A model the stage loaded: a local directory outside a hub cache is hashed as an input,
        a hub model is recorded at its revision."""
        path = Path(ref)
        if path.exists() and _snapshot(path) is None:
            self.add_file(path)
        else:
            self.add_resolved(describe_model(ref, role, revision=revision))

    def add_dataset(
        self,
        repo_id: str,
        role: str,
        *,
        subset: str | None,
        split: str | None,
        revision: str | None,
    ) -> None:
        """A hub dataset the stage loaded, at the commit its revision resolved to."""
        self.add_resolved(
            {
                "role": role,
                "kind": "dataset",
                "id": repo_id,
                "subset": subset,
                "split": split,
                "requested": revision,
                **hub_revision(repo_id, "dataset", revision),
            }
        )

    def sidecar_fields(self) -> dict[str, list]:
        """``write_sidecars``'s ``read`` and ``resolved``."""
        return {"read": list(self.read), "resolved": list(self.resolved)}


def describe_input(path: str | os.PathLike) -> dict[str, Any]:
    side = sidecar_path(path)
    has = side.exists()
    return {
        "path": relative(path),
        **digest(path),
        "provenance": relative(side) if has else None,
        # a later edit of the input's sidecar (the audit's chain) is seen by its consumers
        "provenance_sha256": sha256_file(side) if has else None,
    }


def _env_lock(job: Job) -> dict[str, Any]:
    from . import envlock

    if job.run_dir is None:  # a stage run by hand: the lock is referenced by hash only
        return {"path": None, "sha256": envlock.current_hash()}
    path, sha = envlock.write(job.run_dir)
    return {"path": relative(path), "sha256": sha}


def write_sidecars(
    outputs: Mapping[str, str | os.PathLike],
    inputs: Mapping[str, str | os.PathLike | list | Mapping[str, str]],
    *,
    stage: str,
    params: Mapping[str, Any],
    started: str,
    metrics: Mapping[str, Any] | None = None,
    job: Job = Job(),
    read: list[str | os.PathLike] | None = None,
    resolved: list[Mapping[str, Any]] | None = None,
) -> None:
    """One sidecar per output; each names its siblings and their digests so audit sees the whole
    job. ``read`` and ``resolved``: what the stage noted (``Notes.sidecar_fields``)."""
    # a named list (the tables' models) keeps each entry's name, so the table can be rebuilt
    described = {
        name: (
            [{"name": n, **describe_input(p)} for n, p in v.items()]
            if isinstance(v, Mapping)
            else [describe_input(p) for p in v]
            if isinstance(v, list)
            else describe_input(v)
        )
        for name, v in inputs.items()
    }
    if read:
        described["read"] = [describe_input(p) for p in read]
    digests = {name: digest(path) for name, path in outputs.items()}
    keys = key_variables(params)
    common = {
        "schema": SCHEMA,
        "stage": stage,
        "rule": job.rule or stage,
        "inputs": described,
        "resolved": [dict(r) for r in resolved or []],
        "outputs": {name: relative(p) for name, p in outputs.items()},
        "output_digests": {name: d["sha256"] for name, d in digests.items()},
        "params": redact(dict(params)),
        "seed": params.get("seed"),
        "config_sha256": job.config_sha256,
        "config_path": relative(job.config_path) if job.config_path else None,
        "git": git_state(job.workflow),
        "env_lock": _env_lock(job),
        "packages": package_versions(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "env": environment(keys),
        "started_at": started,
        "ended_at": now(),
        "metrics": dict(metrics or {}),
    }
    common = scrub(common, _secret_values(keys))
    for name, path in outputs.items():
        records = {"record_sha256": record_digests(path)} if "records" in digests[name] else {}
        write_json(
            sidecar_path(path),
            {**common, "artifact": relative(path), "output_name": name, **digests[name], **records},
        )


def read_sidecar(artifact: str | os.PathLike) -> dict[str, Any]:
    return read_json(sidecar_path(artifact))
