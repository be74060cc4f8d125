"""The dual reward of a Triton candidate for a KernelBench-style problem: execution x rules.

``evaluate(problem_src, candidate_src)`` builds the reference ``Model`` here, perturbs its weights
(so a candidate that ignores a weight or a running statistic cannot match), draws fresh inputs per
trial and computes the reference outputs here. The candidate runs in a separate process
(worker.py) that sees only its own source, the init inputs, the weights and the inputs: with a hard
timeout, an address-space limit on CPU, no sockets, subprocesses or file writes, in a scratch
directory. That process is forked by a warm server that has imported torch and triton once
(forkserver.py; ``isolation="fork"``, one server per calling process and device, shared by its
threads) or is a fresh interpreter (``isolation="process"``, ~2 s more per candidate). Its outputs
come back as tensors (``torch.load(weights_only=True)``: data, never code) and are compared here,
where the candidate cannot reach, with dtype-aware tolerances; the inputs must come back
unmodified.

Rule reward: the static rules (rules.py) and, at run time, at least one Triton launch and no torch
compute outside launches. A rule failure zeroes the reward, however correct the outputs.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..config import ValidatorOptions
from . import rules

# (rtol, atol) per dtype. On GPU, tl.dot computes fp32 in TF32 by default, hence the looser fp32
# there.
TOLERANCES = {
    "cpu": {"float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2)},
    "cuda": {"float32": (1e-2, 1e-2), "float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2)},
}


# evaluate's options, as the kernels: config section sets them
_DEFAULT = ValidatorOptions()


@dataclass
class KernelResult:
    exec_reward: float
    rule_reward: float
    reward: float
    compiled: bool
    correct: bool
    launched_triton: bool
    speedup: float | None = None
    reasons: list[str] = field(default_factory=list)
    answered: bool = True  # False: the answer had no code to run (kernels/reward.py)


def load_problem(problem_src: str, workdir: Path):
    """The reference problem as a module, from a real file (inspect and torch want source)."""
    path = workdir / "problem.py"
    path.write_text(problem_src)
    spec = importlib.util.spec_from_file_location(f"kernel_problem_{os.getpid()}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path.unlink()  # the candidate's process never sees the reference
    return module


def _flatten(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flatten(v)]
    return [value]


def _compare(expected, got, device: str) -> str | None:
    """Why ``got`` is not ``expected``, or None."""
    import torch

    want, have = _flatten(expected), _flatten(got)
    if len(want) != len(have):
        return f"returned {len(have)} output(s), expected {len(want)}"
    for i, (w, h) in enumerate(zip(want, have, strict=True)):
        if not isinstance(h, torch.Tensor):
            return f"output {i} is {type(h).__name__}, expected a tensor"
        if h.shape != w.shape or h.dtype != w.dtype:
            return f"output {i} is {h.dtype} {tuple(h.shape)}, expected {w.dtype} {tuple(w.shape)}"
        if w.is_floating_point():
            rtol, atol = TOLERANCES[device.split(":")[0]][str(w.dtype).removeprefix("torch.")]
            close = torch.isclose(h, w, rtol=rtol, atol=atol, equal_nan=True)
            if not bool(close.all()):
                worst = (h - w).abs().nan_to_num(float("inf")).max().item()
                return (
                    f"output {i}: {(~close).sum().item()} of {w.numel()} elements off "
                    f"(max abs error {worst:.3g})"
                )
        elif not torch.equal(h, w):
            return f"output {i}: {(h != w).sum().item()} of {w.numel()} elements differ"
    return None


def evaluate(
    problem_src: str,
    candidate_src: str,
    *,
    device: str = _DEFAULT.device,
    trials: int = _DEFAULT.trials,
    timeout_s: float = _DEFAULT.timeout_s,
    seed: int = 0,
    isolation: str = "fork",
) -> KernelResult:
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
    import torch

    if device == "cuda":
        # this process's GPU (a torchrun rank's), for the reference and the candidate alike
        device = f"cuda:{torch.cuda.current_device()}"

    reasons = rules.check(candidate_src)
    static_ok = not reasons
    with tempfile.TemporaryDirectory(prefix="kernel-") as tmp:
        work = Path(tmp)
        problem = load_problem(problem_src, work)
        torch.manual_seed(seed)
        init_inputs = problem.get_init_inputs()
        model = problem.Model(*init_inputs)
        with torch.no_grad():
            for t in model.state_dict().values():
                if t.is_floating_point():
                    t.add_(0.1 * torch.randn_like(t))
        inputs = []
        for trial in range(trials):
            torch.manual_seed(seed + 1 + trial)
            inputs.append(problem.get_inputs())
        model = model.to(device)
        with torch.no_grad():
            expected = [model(*[x.clone().to(device) for x in trial]) for trial in inputs]
        (work / "candidate.py").write_text(candidate_src)
        torch.save(
            {
                "init_inputs": init_inputs,
                "state_dict": {k: v.cpu() for k, v in model.state_dict().items()},
                "trials": inputs,
                "seed": seed,
                "time_reps": 20 if device.startswith("cuda") else 0,
            },
            work / "job.pt",
        )
        timed_out, returncode, stderr = ISOLATIONS[isolation](work, device, timeout_s)
        if timed_out:
            return _result(False, False, False, reasons + [f"timed out after {timeout_s:g} s"])
        try:
            result = torch.load(work / "result.pt", weights_only=True)
        # a missing or forged result is the candidate's failure
        except Exception as exc:  # noqa: BLE001
            tail = (stderr or "").strip().splitlines()[-3:]
            how = (
                "the kernel fork server died"
                if returncode is None
                else f"killed by {signal.Signals(-returncode).name}"
                if returncode < 0
                else f"exit {returncode}"
            )
            return _result(
                False,
                False,
                False,
                reasons
                + [
                    f"the candidate's process ended ({how}) without a readable result "
                    f"({type(exc).__name__}){': ' + ' | '.join(tail) if tail else ''}"
                ],
            )

    launched = result["launches"] > 0
    if not launched:
        reasons.append("no Triton kernel was launched at run time")
    if result["outside"]:
        reasons.append(f"torch computed outside Triton kernels: {', '.join(result['outside'][:8])}")
    # built, and at least one forward ran
    compiled = result["stage"] == "done" or bool(result["outputs"])
    if result["error"]:
        reasons.append(f"failed at {result['stage']}: {result['error']}")
    correct = result["stage"] == "done"
    if correct:
        # the worker reaches "done" only after one output and one inputs_after per trial
        for i, (want, got) in enumerate(zip(expected, result["outputs"], strict=True)):
            why = _compare([w.cpu() for w in _flatten(want)], got, device)
            if why:
                correct = False
                reasons.append(f"trial {i}: {why}")
        for i, (before, after) in enumerate(zip(inputs, result["inputs_after"], strict=True)):
            if any(not torch.equal(b, a) for b, a in zip(before, after, strict=True)):
                correct = False
                reasons.append(f"trial {i}: the candidate modified its inputs")
    speedup = None
    if correct and result.get("seconds"):
        speedup = _reference_seconds(model, inputs[0], device) / result["seconds"]
    rule_ok = static_ok and launched and not result["outside"]
    out = _result(compiled, correct, rule_ok, reasons, launched, speedup)
    if not reasons:
        out.reasons = ["correct on every trial; Triton kernels did the work"]
    return out


def _run_process(work: Path, device: str, timeout_s: float) -> tuple[bool, int | None, str]:
    """A fresh interpreter runs the worker: (timed out, exit code, stderr)."""
    env = {
        **os.environ,
        "TRITON_CACHE_DIR": str(work / "triton-cache"),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "stillroom.kernels.worker", str(work), device],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the worker and anything it started
        proc.communicate()
        return True, proc.returncode, ""
    return False, proc.returncode, stderr


def _run_forked(work: Path, device: str, timeout_s: float) -> tuple[bool, int | None, str]:
    """A child of this process's warm fork server runs the worker: (timed out, exit code, stderr);
    the exit code is None when the server died while the candidate ran."""
    # a server that died before the candidate started: once more, on a fresh one
    for _ in range(2):
        server = _fork_server(device)
        job = server.submit(work)
        if not job.done.wait(timeout_s):
            server.kill(job)
            job.done.wait()  # the server reports the exit, or dies
            return True, job.exit, ""
        if job.pid is not None:
            break
    return False, job.exit, job.stderr


class _Job:
    def __init__(self, work: Path):
        self.id, self.dir = next(_job_ids), work
        self.pid: int | None = None  # the candidate's process, once the server has forked it
        self.killed = False  # timed out before its pid arrived: killed when it does
        self.exit: int | None = None
        self.stderr = ""
        self.done = threading.Event()


class _ForkServer:
    """This process's side of one fork server (forkserver.py). Requests go to its stdin under a
    lock; a thread reads its replies and matches them to their jobs by id."""

    def __init__(self, device: str):
        self.device = device
        self.lock = threading.Lock()  # jobs, alive and every job's fields
        self.write_lock = threading.Lock()  # the server's stdin; never held with self.lock
        self.jobs: dict[int, _Job] = {}
        self.alive = True
        self.proc: subprocess.Popen | None = None
        self.ready = threading.Event()
        threading.Thread(
            target=self._serve, name=f"kernel-forkserver-{device}", daemon=True
        ).start()
        self.ready.wait()
        if not self.alive:
            code = self.proc.returncode if self.proc else None
            raise RuntimeError(
                f"the kernel fork server for device {device!r} failed to start (exit {code}); "
                "its error is on stderr"
            )

    def _serve(self) -> None:
        # This thread starts the server and lives as long as it does: PR_SET_PDEATHSIG fires when
        # the *thread* that started a process ends, and evaluate often runs on pool threads that
        # come and go.
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        if self.device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "stillroom.kernels.forkserver", self.device],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                text=True,
                bufsize=1,
            )
            for line in self.proc.stdout:
                msg = json.loads(line)
                if "ready" in msg:
                    self.ready.set()
                    continue
                with self.lock:
                    job = self.jobs[msg["id"]]
                    if "pid" in msg:
                        job.pid = msg["pid"]
                        if job.killed:
                            _killpg(job.pid)
                    else:
                        job.exit, job.stderr = msg["exit"], msg["stderr"]
                        del self.jobs[job.id]
                        job.done.set()
        finally:  # the server has gone (or spoke nonsense): fail what it was running
            with self.lock:
                self.alive = False
                for job in self.jobs.values():
                    job.done.set()
                self.jobs.clear()
            self.ready.set()
            if self.proc:
                self.proc.kill()
                self.proc.wait()

    def submit(self, work: Path) -> _Job:
        job = _Job(work)
        with self.lock:
            alive = self.alive
            if alive:
                self.jobs[job.id] = job
        if alive:
            try:
                with self.write_lock:
                    self.proc.stdin.write(json.dumps({"id": job.id, "dir": str(work)}) + "\n")
                    self.proc.stdin.flush()
                return job
            except (OSError, ValueError):  # the server has died
                with self.lock:
                    self.jobs.pop(job.id, None)
        job.done.set()  # never started: no pid
        return job

    def kill(self, job: _Job) -> None:
        """Kill the job's process group (its candidate and anything it started), now or once it has
        one."""
        with self.lock:
            job.killed = True
            # Not once its exit is reported: the server has reaped it, and its pid may belong to
            # another.
            if job.pid is not None and not job.done.is_set():
                _killpg(job.pid)


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone
        pass


_job_ids = itertools.count()
_servers: dict[str, _ForkServer] = {}
_servers_lock = threading.Lock()


def _fork_server(device: str) -> _ForkServer:
    """This process's live fork server for ``device``: started on first use, restarted once
    dead."""
    with _servers_lock:
        server = _servers.get(device)
        if server is None or not server.alive or server.proc.poll() is not None:
            server = _servers[device] = _ForkServer(device)
        return server


def _forget_servers() -> None:
    """In a forked child of this process: the servers' reader threads did not come along; start
    anew."""
    global _servers_lock
    _servers.clear()
    _servers_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_servers)
ISOLATIONS = {"fork": _run_forked, "process": _run_process}


def _result(
    compiled: bool,
    correct: bool,
    rule_ok: bool,
    reasons: list[str],
    launched: bool = False,
    speedup: float | None = None,
) -> KernelResult:
    exec_reward, rule_reward = float(correct), float(rule_ok)
    return KernelResult(
        exec_reward,
        rule_reward,
        exec_reward * rule_reward,
        compiled,
        correct,
        launched,
        speedup,
        reasons,
    )


def _reference_seconds(model, inputs, device: str, reps: int = 20) -> float:
    import time

    import torch

    inputs = [x.to(device) for x in inputs]
    with torch.no_grad():
        model(*inputs)
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(reps):
            model(*inputs)
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / reps
