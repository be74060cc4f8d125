"""The dual reward of a Triton candidate for a KernelBench-style problem: execution x rules.

``evaluate(problem_src, candidate_src)`` builds the reference ``Model`` here, perturbs its weights
(so a candidate that ignores a weight or a running statistic cannot match), draws fresh inputs per
trial and computes the reference outputs here. The candidate runs in a separate process
(worker.py) that sees only its own source, the init inputs, the weights and the inputs: with a hard
timeout, an address-space limit on CPU, no sockets, subprocesses or file writes, in a scratch
directory (the sandbox, sandbox.py), inside bubblewrap where it runs. That process is forked by a
warm server that has imported torch and triton once (``isolation="fork"``) or is a fresh
interpreter (``isolation="process"``, ~2 s more per candidate): isolation.py. Its outputs come
back as tensors (``torch.load(weights_only=True)``: data, never code) and are compared here, where
the candidate cannot reach, with dtype-aware tolerances; the inputs must come back unmodified.

Rule reward: the static rules (rules.py); at run time, at least one Triton launch, no torch compute
but Triton's own (the interpreter's copies), no output sharing memory with an input; and the launch
rules (rules.launch_rules: block sizes, num_warps, instruction estimate, coalescing), checked here
on what the worker recorded of each launch. A rule failure zeroes the reward, however correct the
outputs.
"""

from __future__ import annotations

import importlib.util
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from ..config import ValidatorOptions
from . import rules
from .isolation import ISOLATIONS, job_dir

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
    max_block_size: int = _DEFAULT.max_block_size,
    max_threads_per_block: int = _DEFAULT.max_threads_per_block,
    max_instructions: int = _DEFAULT.max_instructions,
) -> KernelResult:
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
    import torch

    if device == "cuda":
        # this process's GPU (a torchrun rank's), for the reference and the candidate alike
        device = f"cuda:{torch.cuda.current_device()}"

    reasons = rules.check(candidate_src)
    static_ok = not reasons
    # under the root that the candidate's sandbox may write, not a bare temporary directory
    with job_dir() as work:
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
        reasons.append(
            "torch computed outside Triton (called by the forward or a kernel body): "
            + ", ".join(result["outside"][:8])
        )
    aliased = sorted(set(result["aliased"]))
    reasons += aliased
    launch_reasons = rules.launch_rules(
        candidate_src,
        result["launch_records"],
        max_block_size=max_block_size,
        max_threads_per_block=max_threads_per_block,
        max_instructions=max_instructions,
    )
    reasons += launch_reasons
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
    rule_ok = static_ok and launched and not result["outside"] and not aliased
    rule_ok = rule_ok and not launch_reasons
    out = _result(compiled, correct, rule_ok, reasons, launched, speedup)
    if not reasons:
        out.reasons = ["correct on every trial; Triton kernels did the work"]
    return out


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
