"""The dual reward of a Triton candidate for a KernelBench-style problem: execution x rules.

``evaluate(problem_src, candidate_src)`` builds the reference ``Model`` here, perturbs its weights
(so a candidate that ignores a weight or a running statistic cannot match), draws fresh inputs per
trial, adds the generated test cases (cases.py: other value distributions, odd sizes) and computes
the reference outputs here. The candidate runs in a separate process (worker.py) that sees only its
own source, the init inputs, the weights and the inputs: with a hard timeout, an address-space
limit on CPU, no sockets, subprocesses or file writes, in a scratch directory (the sandbox,
sandbox.py), inside bubblewrap where it runs. That process is forked by a warm server that has
imported torch and triton once (``isolation="fork"``) or is a fresh interpreter
(``isolation="process"``, ~2 s more per candidate): isolation.py. Inputs and outputs travel
through the channel file (channel.py), of any size, raw bytes in a layout the parent wrote (data,
never code); the outputs are compared here, where the candidate cannot reach, with dtype-aware
tolerances; the inputs must come back unmodified. The execution reward needs every trial and
every case.

A failure of the validator itself (its memory, the channel, a worker lost before the candidate
started) is ``status="harness"``: no score, never charged to the candidate.

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
from . import channel, rules
from .cases import CASES, generate
from .isolation import ISOLATIONS, job_dir
from .worker import STARTED

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
    # "scored"; "timeout": the candidate ran out of time; "harness": the validator itself failed
    # (its memory, the channel, a worker or fork server lost before the candidate started), so
    # the rewards say nothing of the candidate
    status: str = "scored"
    cases: list[str] = field(default_factory=list)  # the generated cases it was checked on


def load_problem(problem_src: str, workdir: Path):
    """The reference problem as a module, from a real file (inspect and torch want source)."""
    path = workdir / "problem.py"
    path.write_text(problem_src)
    spec = importlib.util.spec_from_file_location(f"kernel_problem_{os.getpid()}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path.unlink()  # the candidate's process never sees the reference
    return module


_flatten = channel.flatten


def _compare(expected, got, device: str, scale_atol: bool = False) -> str | None:
    """Why ``got`` is not ``expected``, or None. ``scale_atol``: atol times the expected output's
    largest magnitude (inputs of a large magnitude)."""
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
            if scale_atol and w.numel():
                atol *= max(1.0, w.abs().max().item())
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
    cases: list[str] | tuple[str, ...] = tuple(_DEFAULT.cases),
) -> KernelResult:
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise ValueError(f"unknown test case(s) {unknown}; expected some of {', '.join(CASES)}")
    import torch

    if device == "cuda":
        # this process's GPU (a torchrun rank's), for the reference and the candidate alike
        device = f"cuda:{torch.cuda.current_device()}"

    reasons = rules.check(candidate_src)
    static_ok = not reasons
    # under the root that the candidate's sandbox may write, not a bare temporary directory
    with job_dir() as work:
        problem = load_problem(problem_src, work)
        try:
            model, init_inputs, labels, inputs, expected, scaled = _build(
                problem, device, trials, seed, cases
            )
        # the validator's own memory, not the candidate's: no score
        except (MemoryError, torch.OutOfMemoryError) as exc:
            return _harness(
                reasons, f"out of memory building the inputs or the reference's outputs ({exc})"
            )
        (work / "candidate.py").write_text(candidate_src)
        try:
            layout = _write_channel(work, inputs, expected)
        except OSError as exc:
            return _harness(reasons, f"the data channel could not be created ({exc})")
        torch.save(
            {
                "init_inputs": init_inputs,
                "state_dict": {k: v.cpu() for k, v in model.state_dict().items()},
                "trials": layout,
                "seed": seed,
                "time_reps": 20 if device.startswith("cuda") else 0,
            },
            work / "job.pt",
        )
        try:
            timed_out, returncode, stderr = ISOLATIONS[isolation](work, device, timeout_s)
        # a fork server that failed to start, a process that could not be forked
        except (RuntimeError, OSError) as exc:
            return _harness(reasons, f"the worker could not be started ({exc})")
        how = _how(timed_out, returncode, timeout_s)
        if not (work / STARTED).exists():
            tail = _tail(stderr)
            return _harness(reasons, f"the worker ended ({how}) before the candidate started{tail}")
        if timed_out:
            out = _result(False, False, False, reasons + [f"timed out after {timeout_s:g} s"])
            out.status = "timeout"
            return out
        try:
            result = torch.load(work / "result.pt", weights_only=True)
        # a missing or forged result is the candidate's failure
        except Exception as exc:  # noqa: BLE001
            return _result(
                False,
                False,
                False,
                reasons
                + [
                    f"the candidate's process ended ({how}) without a readable result "
                    f"({type(exc).__name__}){_tail(stderr)}"
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
            # a forward names the trial or case it failed on
            ran = len(result["outputs"])
            on = (
                f" (on {labels[ran]})" if result["stage"] == "forward" and ran < len(labels) else ""
            )
            reasons.append(f"failed at {result['stage']}: {result['error']}{on}")
        correct = result["stage"] == "done"
        if correct:
            # the worker reaches "done" only after every case's outputs went into the channel
            try:
                correct = _check(
                    work, layout, labels, inputs, expected, scaled, result, device, reasons
                )
            # the validator's own failure to read or compare, not the candidate's
            except (OSError, MemoryError) as exc:
                return _harness(reasons, f"the outputs could not be read or compared ({exc!r})")
    speedup = None
    if correct and result.get("seconds"):
        speedup = _reference_seconds(model, inputs[0], device) / result["seconds"]
    rule_ok = static_ok and launched and not result["outside"] and not aliased
    rule_ok = rule_ok and not launch_reasons
    out = _result(compiled, correct, rule_ok, reasons, launched, speedup)
    out.cases = [label.removeprefix("case ") for label in labels if label.startswith("case ")]
    if not reasons:
        out.reasons = ["correct on every trial and case; Triton kernels did the work"]
    return out


def _build(problem, device: str, trials: int, seed: int, names) -> tuple:
    """The perturbed reference model, its init inputs, and per trial and generated case: a label,
    the inputs, the reference's flattened outputs and whether atol scales with them."""
    import torch

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

    def run(trial_inputs: list) -> list:
        with torch.no_grad():
            args = [
                x.clone().to(device) if isinstance(x, torch.Tensor) else x for x in trial_inputs
            ]
            return _flatten(model(*args))

    expected = [run(trial) for trial in inputs]
    labels = [f"trial {i}" for i in range(trials)]
    scaled = [False] * trials
    for case in generate(model, inputs[0], names=names, seed=seed, run=run):
        labels.append(f"case {case.name}")
        inputs.append(case.inputs)
        expected.append(case.expected)
        scaled.append(case.scale_atol)
    return model, init_inputs, labels, inputs, expected, scaled


def _write_channel(work: Path, inputs: list, expected: list) -> list[dict]:
    """The channel file (channel.py) with every case's inputs in it; its layout."""
    import torch

    layout, size = channel.plan(list(zip(inputs, expected, strict=True)))
    channel.create(work / channel.FILE, size)
    mapping = channel.Mapping(work / channel.FILE, writable=True)
    try:
        for case, spec in zip(inputs, layout, strict=True):
            for x, s in zip(case, spec["inputs"], strict=True):
                if isinstance(x, torch.Tensor):
                    mapping.tensor(s).copy_(x)
    finally:
        mapping.close()
    return layout


def _check(work, layout, labels, inputs, expected, scaled, result, device, reasons) -> bool:
    """Compare every case's outputs in the channel with the reference's, and its inputs as they
    came back with those sent; each failure goes into ``reasons``, naming its trial or case."""
    import torch

    mapping = channel.Mapping(work / channel.FILE, writable=False)
    correct = True
    try:
        for i, label in enumerate(labels):
            why = result["outputs"][i]
            if why is None:
                got = [mapping.tensor(s) for s in layout[i]["outputs"]]
                why = _compare([w.cpu() for w in expected[i]], got, device, scaled[i])
            if why:
                correct = False
                reasons.append(f"{label}: {why}")
            after = mapping.inputs(layout[i])
            if any(
                isinstance(b, torch.Tensor) and not torch.equal(b, a)
                for b, a in zip(inputs[i], after, strict=True)
            ):
                correct = False
                reasons.append(f"{label}: the candidate modified its inputs")
    finally:
        mapping.close()
    return correct


def _how(timed_out: bool, returncode: int | None, timeout_s: float) -> str:
    if timed_out:
        return f"timed out after {timeout_s:g} s"
    if returncode is None:
        return "the kernel fork server died"
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit {returncode}"


def _tail(stderr: str | None) -> str:
    tail = (stderr or "").strip().splitlines()[-3:]
    return ": " + " | ".join(tail) if tail else ""


def _harness(reasons: list[str], why: str) -> KernelResult:
    """The validator failed, not the candidate: no score (grading and GRPO leave it out)."""
    out = _result(False, False, False, reasons + [f"harness: {why}"])
    out.status = "harness"
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
