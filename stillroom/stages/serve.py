"""Rules serve_teacher and serve_model: one server (a self-hosted teacher's, or an evaluated
checkpoint's) for the jobs of its allocation, run by ``stillroom serve`` until Snakemake stops it
(stillroom/runtime/service.py). No stage: it writes no artifact, only its service file, which its
client jobs read and Snakemake deletes with the server; the weights it loaded go into its clients'
provenance, the server they used into their metrics.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from ..config import Experiment
from ..io import DataError


def teacher_spec(exp: Experiment, teacher: str) -> str:
    """The server section of ``teacher`` (a self-hosted one), as rule serve_teacher's param."""
    return json.dumps(exp.teachers[teacher].server.dump())


def model_spec(exp: Experiment) -> str:
    """eval.backend's server section, as rule serve_model's param (the checkpoint is its input)."""
    return json.dumps(exp.eval.backend.server.dump())


def run(
    name: str,
    spec: str,
    out_service: str,
    model: str | None = None,
    server_log: str | None = None,
    log: Callable[[str], None] = print,
) -> int:
    """Serve until stopped: 0 when Snakemake stops the server (its clients are done), 1 when the
    server failed (its service file says why, and its clients fail at once)."""
    from ..runtime.service import serve

    try:
        server = json.loads(spec)
    except json.JSONDecodeError as exc:
        raise DataError(f"--spec: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(server, dict) or "command" not in server:
        raise DataError("--spec: expected a server section (a JSON object with a command)")
    if model:
        server["model_path"] = model
    return serve(name, server, out_service, server_log, log)
