"""The environment lock of a run: every installed distribution (name and version), Python, torch's
CUDA and cuDNN, the GPUs and their driver.

A job writes it once per distinct environment as ``results/<experiment>/env/<sha16>.json`` (named
by the hash of its content, so the jobs of one run share one file and a job in another environment,
e.g. SGLang's, adds its own) and each sidecar references it by hash. ``stillroom audit`` compares
the recorded lock with the environment it runs in (``diff``).

Collected once per process and without importing torch (a stage that does not need torch would pay
seconds for it): torch's version and CUDA come from its ``version.py``, cuDNN from the
``nvidia-cudnn-cu*`` wheel torch loads, the GPUs from ``nvidia-smi``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from ..io import read_json, write_json

SCHEMA = "stillroom.provenance.envlock/1"
CUDNN = re.compile(r"^nvidia-cudnn-cu\d+$")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _packages() -> dict[str, str]:
    """name -> version of every installed distribution; a name installed twice counts as the one
    import finds first (``sys.path`` order, which is the order distributions are listed in)."""
    out: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(_canonical(name), dist.version)
    return dict(sorted(out.items()))


def _torch(packages: dict[str, str]) -> dict[str, str | None] | None:
    spec = importlib.util.find_spec("torch")  # locates the package without importing it
    if spec is None or not spec.origin:
        return None
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return None

    def field(name: str) -> str | None:
        found = re.search(rf"^{name}(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
        return found.group(1) if found else None

    cudnn = next((v for k, v in packages.items() if CUDNN.match(k)), None)
    return {"version": field("__version__"), "cuda": field("cuda"), "cudnn": cudnn}


def _gpus() -> dict[str, Any] | None:
    """The GPU models of this node and its driver (all GPUs, whatever CUDA_VISIBLE_DEVICES says:
    the node's, not the job's); None without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
            timeout=20,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if "," in line]
    if not rows:
        return None
    return {
        "models": sorted({r[0] for r in rows}),
        "count": len(rows),
        "driver": sorted({r[1] for r in rows})[0],
    }


@functools.cache
def current() -> dict[str, Any]:
    """This process's environment (computed once)."""
    packages = _packages()
    return {
        "schema": SCHEMA,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "system": platform.system(),
        "machine": platform.machine(),
        "torch": _torch(packages),
        "gpu": _gpus(),
        "packages": packages,
    }


def lock_hash(lock: dict[str, Any]) -> str:
    return hashlib.sha256(
        json.dumps(lock, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


@functools.cache
def current_hash() -> str:
    return lock_hash(current())


def write(run_dir: str | os.PathLike) -> tuple[Path, str]:
    """The current lock under ``run_dir/env/``, written if no job wrote it yet: (path, hash)."""
    sha = current_hash()
    path = Path(run_dir) / "env" / f"{sha[:16]}.json"
    if not path.exists():
        write_json(path, current())  # atomic: concurrent jobs write the same bytes
    return path, sha


def load(path: str | os.PathLike) -> dict[str, Any]:
    return read_json(path)


def _version(v: str | None) -> str:
    return v if v is not None else "none"


def diff(recorded: dict[str, Any], now: dict[str, Any] | None = None) -> list[str]:
    """Where ``now`` (default: this process) differs from ``recorded``, one line per aspect;
    empty when the same."""
    now = current() if now is None else now
    lines = []
    for key, label in (("python", "python"), ("implementation", "python implementation")):
        if recorded.get(key) != now.get(key):
            lines.append(f"{label} {recorded.get(key)} -> {now.get(key)}")
    old_t, new_t = recorded.get("torch") or {}, now.get("torch") or {}
    for key, label in (("cuda", "torch CUDA"), ("cudnn", "cuDNN")):
        if old_t.get(key) != new_t.get(key):
            lines.append(f"{label} {_version(old_t.get(key))} -> {_version(new_t.get(key))}")
    if (recorded.get("gpu") or None) != (now.get("gpu") or None):
        lines.append(f"GPU {recorded.get('gpu')} -> {now.get('gpu')}")
    old, new = recorded.get("packages") or {}, now.get("packages") or {}
    changed = [
        f"{k} {old[k]} -> {new[k]}" for k in sorted(old.keys() & new.keys()) if old[k] != new[k]
    ]
    added = [f"{k} {new[k]}" for k in sorted(new.keys() - old.keys())]
    removed = [f"{k} {old[k]}" for k in sorted(old.keys() - new.keys())]
    for label, items in (("changed", changed), ("added", added), ("removed", removed)):
        if items:
            lines.append(f"packages {label} ({len(items)}): {', '.join(items)}")
    return lines
