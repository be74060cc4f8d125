"""The GPU check's run: the shared model and data, each check in a process of its own with
its own time limit under one overall deadline, and the JSON summary."""

from __future__ import annotations

import argparse
import collections
import importlib
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..io import write_text
from .common import SIZES, Log
from .fixture import build_fixture, check_kwargs

DEFAULT_OUT = "results/gpu-check.json"
# Seconds from start to the summary: 8 minutes less what the interpreter and the venv check take.
DEADLINE_S = 450.0
# Per-check limits. The checks before the kernels take at most 310 s, so the kernels, which come
# last and stop early on their own when time runs short, always get 140 s and up to their 200 s
# when the others finish sooner (the deadline trims their limit).
LIMITS_S = {
    "sft": 90.0,
    "qlora": 70.0,
    # torchrun, one worker per GPU, staged load, a few steps, then the merge in its own process
    "qlora_fsdp_staged": 100.0,
    "evaluate": 50.0,
    "kernels": 200.0,
}
# A check is not started with less than this left: it would only be killed.
MIN_START_S = 20.0
# Of a kernel check's limit, kept for its process start (torch, triton) and the summary.
KERNEL_MARGIN_S = 20.0
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes", "triton")
# the package's docstring describes the checks
DESCRIPTION = importlib.import_module(__package__).__doc__.splitlines()[0]
CHECKS = {
    "sft": "stillroom.gpucheck.sft:check_sft",
    "qlora": "stillroom.gpucheck.qlora:check_qlora",
    "qlora_fsdp_staged": "stillroom.gpucheck.flagship:check_qlora_fsdp_staged",
    "evaluate": "stillroom.gpucheck.evaluate:check_evaluate",
    "kernels": "stillroom.gpucheck.kernels:check_kernels",
}


def _die_with_parent() -> None:
    """In the check's process: SIGKILL when the summary's process dies, so that no orphan keeps
    the GPU."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def run_isolated(
    name: str,
    target: str,
    kwargs: Mapping[str, Any],
    limit_s: float,
    *,
    env: Mapping[str, str] | None = None,
    log: Log = print,
) -> dict[str, Any]:
    """``target(**kwargs)`` ("module:function") in a process of its own, killed with everything it
    started after ``limit_s``; its output goes to ``log`` line by line, prefixed with ``name``.
    Returns its result, or a status ``error`` / ``timeout`` with the reason and its last lines."""
    tail: collections.deque[str] = collections.deque(maxlen=20)
    with tempfile.TemporaryDirectory(prefix=f"gpu-check-{name}-") as tmp:
        spec, result = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec.write_text(
            json.dumps({"target": target, "kwargs": dict(kwargs), "result": str(result)})
        )
        start = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "stillroom.gpucheck", "--child", str(spec)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env={
                # libraries' deprecation notices would bury the check's own lines
                "PYTHONWARNINGS": "ignore::FutureWarning,ignore::DeprecationWarning",
                **os.environ,
                **(env or {}),
                "PYTHONUNBUFFERED": "1",
            },
            start_new_session=True,  # its own process group: killed whole
            preexec_fn=_die_with_parent,
        )

        def relay() -> None:
            for line in proc.stdout:
                tail.append(line.rstrip())
                log(f"[{name}] {line.rstrip()}")

        reader = threading.Thread(target=relay, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=limit_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            timed_out = True
        reader.join(timeout=5)  # a grandchild may still hold the pipe
        seconds = round(time.monotonic() - start, 1)
        if timed_out:
            out = {
                "status": "timeout",
                "error": f"killed at its time limit of {limit_s:.0f} s",
                "log_tail": list(tail),
            }
        elif result.exists():
            out = json.loads(result.read_text())
        else:
            out = {
                "status": "error",
                "error": f"its process ended (exit {proc.returncode}) without a result",
                "log_tail": list(tail),
            }
    return {"status": out.pop("status"), "wall_s": seconds, "limit_s": round(limit_s), **out}


def run_checks(
    plan: Mapping[str, tuple[str, Mapping[str, Any], float]],
    *,
    deadline: float,
    env: Mapping[str, str] | None = None,
    log: Log = print,
) -> dict[str, dict]:
    """Run each check of ``plan`` (name -> (target, kwargs, limit_s)) in order, each within its
    limit and none past ``deadline`` (a time.monotonic() value); a check without time to run is
    skipped. A check whose kwargs take ``budget_s`` is told how long it has."""
    results: dict[str, dict] = {}
    for name, (target, kwargs, limit) in plan.items():
        left = deadline - time.monotonic()
        if left < MIN_START_S:
            results[name] = {"status": "skipped", "reason": f"overall deadline: {left:.0f} s left"}
            continue
        limit = min(limit, left)
        if "budget_s" in kwargs:
            kwargs = {**kwargs, "budget_s": max(1.0, limit - KERNEL_MARGIN_S)}
        log(f"{name}: starting, limit {limit:.0f} s")
        results[name] = run_isolated(name, target, kwargs, limit, env=env, log=log)
        log(f"{name}: {results[name]['status']} in {results[name]['wall_s']} s")
    return results


def device_report() -> tuple[dict[str, Any], str | None]:
    """(what torch sees, why there is no CUDA device or None)."""
    import torch

    info: dict[str, Any] = {"torch_cuda": torch.version.cuda, "cuda_available": False}
    if torch.version.cuda is None:
        return info, f"no CUDA device: torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return info, (
            f"no CUDA device: torch {torch.__version__} sees no GPU"
            + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else "")
        )
    props = torch.cuda.get_device_properties(0)
    info.update(
        cuda_available=True,
        name=props.name,
        count=torch.cuda.device_count(),
        capability=f"{props.major}.{props.minor}",
        memory_gib=round(props.total_memory / 2**30, 1),
    )
    return info, None


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in (*PACKAGES, "flash-attn"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _write(path: str, summary: dict) -> None:
    text = json.dumps(summary, indent=2)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_text(path, text + "\n")
    print(text, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stillroom.gpucheck", description=DESCRIPTION)
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"the JSON summary (default {DEFAULT_OUT})")
    ap.add_argument("--checks", default=",".join(CHECKS), help="comma-separated subset, in order")
    ap.add_argument(
        "--device",
        choices=["auto", "cuda", "cpu"],
        default="auto",
        help="auto: the GPU, or a skipped summary without one; cpu: toy sizes on CPU",
    )
    ap.add_argument("--deadline-s", type=float, default=DEADLINE_S, help="overall time limit")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return _child(args.child)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars would bury the checks' lines
    started = time.monotonic()
    deadline = started + args.deadline_s
    names = [n.strip() for n in args.checks.split(",") if n.strip()]
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        ap.error(f"--checks: unknown {', '.join(unknown)} (known: {', '.join(CHECKS)})")

    from ..provenance.sidecars import now

    stamp, host = now(), os.uname().nodename
    info, missing = device_report()
    device = args.device if args.device != "auto" else ("cuda" if missing is None else None)
    if device == "cuda" and missing:
        ap.error(f"--device cuda: {missing}")
    if device is None:
        summary = {
            "status": "skipped",
            "reason": missing,
            "started": stamp,
            "host": host,
            "device": info,
            "versions": _versions(),
            "checks": {n: {"status": "skipped", "reason": "no CUDA device"} for n in names},
        }
        _write(args.out, summary)
        return 0

    def log(msg: str) -> None:
        print(f"[gpu-check {time.monotonic() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    sizes = SIZES[device]
    # On CPU the trainer must not find a GPU either: every check then runs where it says.
    env = {"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        t0 = time.monotonic()
        log(f"building the {device} model and data")
        moe = "qlora_fsdp_staged" in names
        fixture = build_fixture(Path(tmp), sizes, moe=moe)
        model = {
            **{k: fixture[k] for k in ("parameters", "vocab_size", "conversations")},
            "shape": sizes.model,
            **(
                {"moe_parameters": fixture["moe_parameters"], "moe_shape": sizes.moe_model}
                if moe
                else {}
            ),
            "build_s": round(time.monotonic() - t0, 1),
        }
        plan = {
            name: (CHECKS[name], check_kwargs(name, device, sizes, fixture), LIMITS_S[name])
            for name in names
        }
        checks = run_checks(plan, deadline=deadline, env=env, log=log)
    passed = [n for n, c in checks.items() if c["status"] == "pass"]
    summary = {
        "status": "pass" if len(passed) == len(checks) else "fail",
        "on": device,
        "started": stamp,
        "seconds": round(time.monotonic() - started, 1),
        "deadline_s": args.deadline_s,
        "host": host,
        "device": info,
        "versions": _versions(),
        "passed": passed,
        "not_passed": [n for n in checks if n not in passed],
        "model": model,
        "checks": checks,
    }
    _write(args.out, summary)
    return 0 if summary["status"] == "pass" else 1


def _child(spec_path: str) -> int:
    """In a check's process: run its target, write its result (an error as a result too)."""
    spec = json.loads(Path(spec_path).read_text())
    module, _, function = spec["target"].partition(":")
    try:
        target = getattr(importlib.import_module(module), function)
        out = target(**spec["kwargs"], log=lambda msg: print(msg, flush=True))
    except Exception as exc:  # noqa: BLE001 - any failure of a check is its result
        out = {
            "status": "error",
            "error": f"{type(exc).__name__}: {exc}"[:2000],
            "traceback": traceback.format_exc().splitlines()[-15:],
        }
    write_text(spec["result"], json.dumps(out) + "\n")
    return 0 if out.get("status") == "pass" else 1
