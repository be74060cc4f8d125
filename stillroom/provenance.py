"""Provenance sidecars: ``<artifact>.prov.json`` beside every artifact.

A sidecar names the stage and rule, every input with its sha256 (directories: a manifest of
per-file hashes) and the path of the input's own sidecar, the params, the resolved config's hash,
the code commit and dirty state, package versions, host, SLURM job, times, seed and stage metrics.
``audit`` walks these links from a table back to the raw teacher records and re-hashes each file.
Nothing secret is written: environment values and params whose names look like credentials are
redacted.
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
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .io import read_json, write_json

SCHEMA = "stillroom.provenance/1"
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
ENV_KEPT = re.compile(
    r"^(STILLROOM_|SLURM_JOB_ID$|SLURM_JOB_NODELIST$|SLURM_NNODES$"
    r"|CUDA_VISIBLE_DEVICES$|OMP_NUM_THREADS$)"
)
SUFFIX = ".prov.json"
# Snakemake marks finished directory outputs with it after the job
IGNORED = {".snakemake_timestamp"}


def sidecar_path(artifact: str | os.PathLike) -> Path:
    return Path(str(artifact).rstrip("/") + SUFFIX)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def digest(path: str | os.PathLike) -> dict[str, Any]:
    """sha256 of a file, or for a directory a manifest of per-file hashes and a hash over it."""
    path = Path(path)
    if path.is_dir():
        files = {
            str(p.relative_to(path)): sha256_file(p)
            for p in sorted(path.rglob("*"))
            if p.is_file() and p.name not in IGNORED
        }
        total = hashlib.sha256(
            "".join(f"{k}\0{v}\n" for k, v in files.items()).encode()
        ).hexdigest()
        return {"sha256": total, "files": files}
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def redact(obj: Any) -> Any:
    """Copy of params with every value under a credential-like key replaced."""
    if isinstance(obj, Mapping):
        return {
            k: (
                "<redacted>" if SECRET.search(str(k)) and not str(k).endswith("_env") else redact(v)
            )
            for k, v in obj.items()
        }
    if isinstance(obj, list | tuple):
        return [redact(v) for v in obj]
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
        from .config import config_hash

        return config_hash(read_json(self.config_path))


@functools.cache
def git_state(repo: str | None = None) -> dict[str, Any] | None:
    """Commit and dirty state of the workflow's repository, else of this package's."""
    repo = repo or str(Path(__file__).resolve().parent.parent)

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", repo, *args], capture_output=True, text=True, check=True, timeout=20
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
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


def environment() -> dict[str, str]:
    return {
        k: ("<redacted>" if SECRET.search(k) else v)
        for k, v in sorted(os.environ.items())
        if ENV_KEPT.match(k)
    }


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def describe_input(path: str | os.PathLike) -> dict[str, Any]:
    side = sidecar_path(path)
    return {"path": str(path), **digest(path), "provenance": str(side) if side.exists() else None}


def write_sidecars(
    outputs: Mapping[str, str | os.PathLike],
    inputs: Mapping[str, str | os.PathLike | list | Mapping[str, str]],
    *,
    stage: str,
    params: Mapping[str, Any],
    started: str,
    metrics: Mapping[str, Any] | None = None,
    job: Job = Job(),
) -> None:
    """One sidecar per output; each names its siblings so audit sees the whole job."""
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
    common = {
        "schema": SCHEMA,
        "stage": stage,
        "rule": job.rule or stage,
        "inputs": described,
        "outputs": {name: str(p) for name, p in outputs.items()},
        "params": redact(dict(params)),
        "seed": params.get("seed"),
        "config_sha256": job.config_sha256,
        "config_path": str(Path(job.config_path).resolve()) if job.config_path else None,
        "git": git_state(job.workflow),
        "packages": package_versions(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "env": environment(),
        "started_at": started,
        "ended_at": now(),
        "metrics": dict(metrics or {}),
    }
    for name, path in outputs.items():
        write_json(
            sidecar_path(path),
            {**common, "artifact": str(path), "output_name": name, **digest(path)},
        )


def read_sidecar(artifact: str | os.PathLike) -> dict[str, Any]:
    return read_json(sidecar_path(artifact))
