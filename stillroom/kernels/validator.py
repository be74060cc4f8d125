"""The dual reward of a Triton candidate for a KernelBench-style problem: execution x rules, of the
program the candidate describes, replayed by a trusted runner on inputs it never saw.

``evaluate(problem_src, candidate_src)`` builds the reference ``Model`` here, perturbs its weights
(so a candidate that ignores a weight or a running statistic cannot match) and draws every case's
inputs from a secret seed (``replay_seed``: unless given, drawn at random, or, with a key file
named by ``$STILLROOM_KERNEL_KEY_FILE``, derived from the key, the problem, the candidate and
``seed``, so that a rerun reproduces every grade; recorded in the result): the
trials (fresh ``get_inputs()`` draws) and the generated cases (cases.py: other value
distributions, odd sizes). Then:

1. **Extract** (extract.py, untrusted, sandboxed): the candidate's ``ModelNew`` runs twice in a
   row per input signature (shapes, dtypes), on two draws of its own (other secret seeds), and
   reports what its forward did: the Triton kernels it launched (source, grid, arguments,
   constexprs, num_warps) and the allocations, fills, copies and views between them.
2. **Check** (program.py, kernel_source.py, here): the report is data; each kernel's source
   passes a whitelist, compiles, and is rewritten into a canonical form; each buffer, view and
   step is checked against the case and the limits; the two calls of a signature must record one
   program (a module that keeps its first call's result, or whose host work depends on the input
   values, fails).
3. **Replay** (replay.py, trusted, sandboxed: a fresh process that never ran candidate code): the
   checked program runs on every case, its returned buffers are the outputs. On CPU every program
   instance of every launch runs, in a random order (a secret seed), instrumented for the launch
   rules; every access is bounds-checked; two instances of a launch that touch one address
   without atomics, one storing, are a data race; every config of an autotuned launch runs (on
   copies) and must compute what the chosen one did.
4. **Judge** (here): outputs compared with the reference's (dtype-aware tolerances); inputs must
   come back unmodified; the launch rules (launch_checks.py) on the replay's values; at least one
   launch; no output that is an input's memory.

Two rules decide what may carry the answer:

- **Every output byte is written by a kernel** (on CPU): by a Triton store or atomic of the
  replay, or copied by host steps from bytes one wrote. Host steps may allocate, fill, view and
  copy inputs into place for the kernels, and copy what kernels wrote; an output (or any part of
  one) that host steps alone made (a transpose by ``.contiguous()``, a concat by ``copy_`` into
  slices, a zero op by ``zeros_like``) fails the case.
- **Only the problem's own values enter a program**: its inputs, the reference model's
  parameters and buffers (those outside the state dict too), and fills by a constant. Any other
  tensor the candidate's process made (a table torch computed from no input, a cache, a scalar
  tensor) is replayed as uninitialised memory, like an empty allocation: a kernel may use it as
  scratch it writes first, never read values from it. No size bound would do: an interpolation
  table of 2048 knots is 8 KiB, and a table over every float16 bit pattern 128 KiB.

Whatever the candidate computed in its own process (with torch, in Python, in a lookup table
built from the seeds it could guess, by patching anything) is not part of the program: it cannot
reach the outputs. A failure of the validator itself (its memory, a channel, a job lost before it
started) is ``status="harness"``: no score, never charged to the candidate; whatever a candidate
writes (a source that does not compile, a tree nested too deep, a forged record) is 0 with a
reason. A sandbox that cannot start raises isolation.SandboxError.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import importlib.util
import json
import os
import secrets
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .. import sandbox
from ..config import ValidatorOptions
from . import channel, extract, kernel_source, launch_checks, program, replay
from .cases import CASES, generate, resized
from .isolation import ISOLATIONS, Outcome, job_dir

# (rtol, atol) per dtype. On GPU, tl.dot computes fp32 in TF32 by default, hence the looser fp32
# there.
TOLERANCES = {
    "cpu": {"float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2)},
    "cuda": {"float32": (1e-2, 1e-2), "float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2)},
}

# evaluate's options, as the kernels: config section sets them
_DEFAULT = ValidatorOptions()

# A file whose bytes key the secret seeds (the replay's inputs, the extraction's, the order
# program instances run in): kept outside the results and every sandbox, so a rerun reproduces
# its grades while no candidate can compute them; recorded only by its digest (key_digest). Make
# it random (``python -c "import secrets; print(secrets.token_hex(32))" > FILE``): a short key
# could be guessed from its digest. Unset: fresh random seeds per evaluation.
KEY_FILE_ENV = "STILLROOM_KERNEL_KEY_FILE"


@functools.cache
def _key(path: str) -> bytes:
    try:
        key = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"${KEY_FILE_ENV}: cannot read the key file {path}: {exc}") from None
    if not key.strip():
        raise ValueError(f"${KEY_FILE_ENV}: the key file {path} is empty")
    return key


def key_digest() -> str | None:
    """The sha256 of the key file named by ``$STILLROOM_KERNEL_KEY_FILE``, or None without one."""
    path = os.environ.get(KEY_FILE_ENV)
    return hashlib.sha256(_key(path)).hexdigest() if path else None


def _seeds(problem_src: str, candidate_src: str, seed: int) -> Callable[[str], int]:
    """The secret seeds of one evaluation, one per purpose: derived from the key with HMAC (the
    same for the same problem, candidate and seed; any other candidate gets others), or random
    without a key."""
    path = os.environ.get(KEY_FILE_ENV)
    if not path:
        return lambda purpose: secrets.randbits(62)
    key = _key(path)
    evaluation = json.dumps([problem_src, candidate_src, seed]).encode()

    def draw(purpose: str) -> int:
        mac = hmac.new(key, purpose.encode() + b"\0" + evaluation, hashlib.sha256)
        return int.from_bytes(mac.digest()[:8], "big") >> 2  # 62 bits, as secrets.randbits(62)

    return draw


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
    # "scored"; "timeout": the candidate (or its program) ran out of time; "harness": the
    # validator itself failed (its memory, a channel, a job lost before it started), so the
    # rewards say nothing of the candidate
    status: str = "scored"
    cases: list[str] = field(default_factory=list)  # the generated cases it was checked on
    replay_seed: int | None = None  # the cases' inputs come from it: evaluate(replay_seed=...)
    program: list[str] = field(default_factory=list)  # what was replayed, a line per step


def load_problem(problem_src: str, workdir: Path):
    """The reference problem as a module, from a real file (inspect and torch want source)."""
    path = workdir / "problem.py"
    path.write_text(problem_src)
    spec = importlib.util.spec_from_file_location(f"kernel_problem_{os.getpid()}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path.unlink()  # no job's process ever sees the reference
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
    replay_seed: int | None = None,
) -> KernelResult:
    """The reward of ``candidate_src`` for ``problem_src``. ``seed`` perturbs the reference's
    weights; the inputs come from ``replay_seed`` (drawn at random unless given)."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise ValueError(f"unknown test case(s) {unknown}; expected some of {', '.join(CASES)}")
    import torch

    if device == "cuda":
        # this process's GPU (a torchrun rank's), for the reference and the replay alike
        device = f"cuda:{torch.cuda.current_device()}"
    draw = _seeds(problem_src, candidate_src, seed)
    if replay_seed is None:
        replay_seed = draw("replay")
    elif (
        isinstance(replay_seed, bool)
        or not isinstance(replay_seed, int)
        or not 0 <= replay_seed < 2**62
    ):
        raise ValueError(f"replay_seed must be an integer in [0, 2**62), got {replay_seed!r}")
    run = ISOLATIONS[isolation]
    limits = dict(
        max_block_size=max_block_size,
        max_threads_per_block=max_threads_per_block,
        max_instructions=max_instructions,
    )
    with job_dir() as work:
        problem = load_problem(problem_src, work)
        try:
            # the seeds are the validator's own: the caller's random state (a trainer's
            # sampling) is left as it was
            with torch.random.fork_rng(devices=[]):
                built = _build(problem, device, trials, seed, replay_seed, cases, draw)
        # the validator's own memory, not the candidate's: no score
        except (MemoryError, torch.OutOfMemoryError) as exc:
            return _harness(
                [], f"out of memory building the inputs or the reference's outputs ({exc})"
            )
        ev = _Evaluation(work, candidate_src, built, device, timeout_s, seed, run, draw)
        result = ev.extract() or ev.check() or ev.replay() or ev.judge(limits)
        seconds = ev.seconds
    result.replay_seed = replay_seed
    result.cases = [
        label.removeprefix("case ") for label in built.labels if label.startswith("case ")
    ]
    if result.correct and seconds:
        result.speedup = _reference_seconds(built.model, built.inputs[0], device) / seconds
    return result


@dataclass
class _Built:
    model: object
    init_inputs: list
    labels: list[str]
    inputs: list[list]
    expected: list[list]
    scaled: list[bool]
    extraction: list[list]  # per signature: the extraction's own inputs
    again: list[list]  # per signature: a second draw of them, for a second call
    signature_of: list[int]  # per case: its signature's index


def _build(
    problem, device: str, trials: int, seed: int, replay_seed: int, names, draw: Callable
) -> _Built:
    """The perturbed reference model, its init inputs; per trial and generated case a label, the
    inputs, the reference's flattened outputs and whether atol scales with them; the input
    signatures and, for each, two draws of the extraction's inputs (apart from every case's)."""
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
        torch.manual_seed(replay_seed + 1 + trial)
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
    for case in generate(model, inputs[0], names=names, seed=replay_seed, run=run):
        labels.append(f"case {case.name}")
        inputs.append(case.inputs)
        expected.append(case.expected)
        scaled.append(case.scale_atol)
    # the extraction's inputs: two draws of its own (other secret seeds), resized like each case
    draws = []
    for i in range(2):
        extraction_seed = draw(f"extraction {i}")
        torch.manual_seed(extraction_seed)
        draws.append((problem.get_inputs(), torch.Generator().manual_seed(extraction_seed)))
    signatures: list[tuple] = []
    extraction: list[list] = []
    again: list[list] = []
    signature_of = []
    for case in inputs:
        sig = _signature(case)
        if sig not in signatures:
            signatures.append(sig)
            for out, (base, gen) in zip((extraction, again), draws, strict=True):
                out.append(_like(base, inputs[0], case, gen))
        signature_of.append(signatures.index(sig))
    return _Built(
        model, init_inputs, labels, inputs, expected, scaled, extraction, again, signature_of
    )


def _signature(case: list) -> tuple:
    import torch

    return tuple(
        (tuple(x.shape), str(x.dtype)) if isinstance(x, torch.Tensor) else ("value", repr(x))
        for x in case
    )


def _like(base: list, first: list, case: list, gen) -> list:
    """Extraction inputs with ``case``'s signature: ``base`` (its own draw of trial 0's
    signature), resized as ``case`` differs from ``first``; values never taken from a case."""
    import torch

    if _signature(base) == _signature(case):
        return base
    sizes: dict[int, int] = {}
    for a, b in zip(first, case, strict=True):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == b.dim():
            for old, new in zip(a.shape, b.shape, strict=True):
                if old != new:
                    sizes.setdefault(old, new)
    like = resized(base, sizes, gen) if _signature(base) == _signature(first) else None
    if like is not None and _signature(like) == _signature(case):
        return like
    out = []  # sizes that do not map one to one: fresh values of the case's shapes
    for x in case:
        if not isinstance(x, torch.Tensor):
            out.append(x)
        elif x.is_floating_point():
            out.append(torch.randn(x.shape, generator=gen).to(x.dtype))
        elif x.dtype == torch.bool:
            out.append(torch.randint(0, 2, x.shape, generator=gen).bool())
        else:
            low, high = (int(x.min()), int(x.max())) if x.numel() else (0, 0)
            out.append(torch.randint(low, high + 1, x.shape, generator=gen, dtype=x.dtype))
    return out


def _shapes(state: dict) -> dict[str, tuple[str, list[int]]]:
    """A state dict's dtype and shape per name: what a program's state storages are checked on."""
    return {name: (str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in state.items()}


class _Evaluation:
    """One candidate through the four steps; each step returns a result when it ends the
    evaluation (the harness failed, the candidate timed out or left nothing to run), else None."""

    def __init__(self, work: Path, candidate_src: str, built: _Built, device, timeout_s, seed, run,
                 draw: Callable[[str], int]):  # fmt: skip
        self.work, self.source, self.built = work, candidate_src, built
        self.device, self.timeout_s, self.seed, self.run = device, timeout_s, seed, run
        self.draw = draw  # the evaluation's secret seeds
        self.reasons: list[str] = []
        self.seconds: float | None = None  # the program's, timed by the replay on a GPU

    def extract(self) -> KernelResult | None:
        """Run the candidate in its sandbox; keep its record."""
        import torch

        built, ex = self.built, self.work / "extract"
        ex.mkdir(mode=0o700)
        (ex / "candidate.py").write_text(self.source)
        try:
            draws = built.extraction + built.again
            layouts, size = channel.plan([(inputs, []) for inputs in draws])
            self.layouts = layouts[: len(built.extraction)]
            channel.create(ex / channel.EXTRACT, size)
            _fill(ex / channel.EXTRACT, draws, layouts)
            persistent = {k: v.detach().cpu() for k, v in built.model.state_dict().items()}
            # the buffers outside the state dict are the problem's own values too
            buffers = {
                k: v.detach().cpu() for k, v in built.model.named_buffers() if k not in persistent
            }
            self.state = {**persistent, **buffers}
            job = {
                "init_inputs": built.init_inputs,
                "state_dict": persistent,
                "buffers": buffers,
                "signatures": self.layouts,
                "again": layouts[len(built.extraction) :],
                "seed": self.seed,
            }
            torch.save(job, ex / "job.pt")
            _sparse(ex / extract.OUT, extract.RECORD_SPACE)
        except OSError as exc:
            return _harness([], f"the extraction's files could not be written ({exc})")
        outcome = self.run(ex, "extract", self.device, self.timeout_s)
        how = _how(outcome, self.timeout_s)
        if not outcome.started:
            why = f"the extraction ended ({how}) before the candidate started"
            return _harness([], why + _tail(outcome.stderr))
        if outcome.blocked:  # it slept or waited on nothing: the candidate's own doing
            return _timeout([f"{how} (running the candidate)"])
        if outcome.timed_out:  # the machine's fault: a CPU limit judges the candidate
            return _harness([], f"the extraction {how}")
        if outcome.out_of_cpu:
            return _timeout([f"{how} (running the candidate)"])
        self.record, why = extract.read_out(ex / extract.OUT)
        if self.record is not None and not isinstance(self.record, dict):
            self.record, why = None, "the record is not an object"
        if self.record is None:
            return _result(False, False, False, [
                f"the candidate's process ended ({how}) without a readable record "
                f"({why}){_tail(outcome.stderr)}"
            ])  # fmt: skip
        if self.record.get("error"):
            stage = self.record.get("stage", "?")
            return _result(False, False, False, [f"failed at {stage}: {self.record['error']}"])
        return None

    def check(self) -> KernelResult | None:
        """The record as programs, one per input signature, each kernel through the whitelist."""
        built = self.built
        self.parsed = parsed = program.parse(self.record, self.layouts, _shapes(self.state))
        self.reasons += parsed.reasons
        self.programs = [p for p in parsed.programs if p is not None]
        self.launched = any(p.launches for p in self.programs)
        self.summary = self.programs[0].summary() if self.programs else []
        self.errors: list[str | None] = [parsed.errors[s] for s in built.signature_of]
        self.runnable = [i for i, s in enumerate(built.signature_of) if parsed.programs[s]]
        if self.runnable:
            return None
        out = _result(False, False, False, self.reasons + _case_reasons(built.labels, self.errors))
        out.launched_triton, out.program = self.launched, self.summary
        return out

    def replay(self) -> KernelResult | None:
        """Run the checked programs on every case in a trusted sandboxed process."""
        import torch

        built, rp = self.built, self.work / "replay"
        rp.mkdir(mode=0o700)
        kernels = program.kernels_of(self.parsed)
        (rp / "kernels.py").write_text(kernel_source.source(kernels))
        (rp / "kernels_analysis.py").write_text(kernel_source.instrument(kernels))
        try:
            self.layout, size = channel.plan(list(zip(built.inputs, built.expected, strict=True)))
            channel.create(rp / channel.FILE, size)
            _fill(rp / channel.FILE, built.inputs, self.layout)
            # written again, not linked from the extraction's job.pt: nothing the candidate's
            # directory held reaches the replay
            torch.save(self.state, rp / "state.pt")
            _sparse(rp / replay.RESULT, replay.RESULT_BYTES)
        except OSError as exc:
            return _harness(self.reasons, f"the replay's files could not be written ({exc})")
        index = {id(p): i for i, p in enumerate(self.programs)}
        job = {
            "programs": [p.to_json() for p in self.programs],
            "cases": [
                {
                    "program": index[id(self.parsed.programs[built.signature_of[i]])],
                    "layout": self.layout[i],
                }
                for i in self.runnable
            ],
            "modules": sorted({m for k in kernels for m in k.modules}),
            "time_reps": 20 if self.device.startswith("cuda") else 0,
            # the order program instances run in (CPU) and the instances a GPU's analysis
            # interprets: a seed no candidate sees
            "order_seed": self.draw("order"),
            # autotuned configs must agree within them
            "tolerances": TOLERANCES[self.device.split(":")[0]],
        }
        (rp / "replay.json").write_text(json.dumps(job))
        outcome = self.run(rp, "replay", self.device, self.timeout_s)
        how = _how(outcome, self.timeout_s)
        if not outcome.started:
            why = f"the replay ended ({how}) before it started"
            return _harness(self.reasons, why + _tail(outcome.stderr))
        if outcome.timed_out:  # the machine's fault: a CPU limit judges the program
            return _harness(self.reasons, f"the replay {how}")
        if outcome.out_of_cpu:
            out = _timeout(self.reasons + [f"{how} (replaying the program)"])
            out.compiled, out.launched_triton, out.program = True, self.launched, self.summary
            return out
        self.replayed, why = replay.read_result(rp / replay.RESULT)
        failed = self.replayed.get("error") if self.replayed is not None else why
        if failed:
            if str(failed).startswith("harness:"):
                return _harness(self.reasons, str(failed).removeprefix("harness: "))
            out = _result(False, False, False, self.reasons + [
                f"the replay of the program ended ({how}) without a result "
                f"({failed}){_tail(outcome.stderr)}"
            ])  # fmt: skip
            out.launched_triton, out.program = self.launched, self.summary
            return out
        cases = list(self.replayed.get("cases", []))
        cases += ["the replay reported no outcome for it"] * (len(self.runnable) - len(cases))
        for i, why in zip(self.runnable, cases, strict=False):
            self.errors[i] = why
        self.seconds = self.replayed.get("seconds")
        return None

    def judge(self, limits: dict) -> KernelResult:
        """What the program is, then what it computed, then the launch rules."""
        reasons = self.reasons
        not_made = _outputs_not_made(self.programs)
        reasons += not_made
        if not self.launched:
            reasons.append("no Triton kernel was launched")
        try:
            correct = _check(
                self.work / "replay", self.layout, self.built, self.errors, self.runnable,
                self.device, reasons,
            )  # fmt: skip
        # the validator's own failure to read or compare, not the candidate's
        except (OSError, MemoryError) as exc:
            return _harness(reasons, f"the outputs could not be read or compared ({exc!r})")
        compiled = any(self.errors[i] is None for i in self.runnable)
        rule_reasons = launch_checks.check(self.parsed, self.replayed.get("analysed", {}), **limits)
        reasons += rule_reasons
        if not correct:
            reasons += _constants_read(self.programs)
        # every kernel passed the whitelist, one was launched, every output is the program's
        rule_ok = not self.parsed.reasons and self.launched and not not_made and not rule_reasons
        out = _result(compiled, correct, rule_ok, reasons, self.launched)
        out.program = self.summary
        if not out.reasons:
            out.reasons = ["correct on every trial and case; Triton kernels did the work"]
        return out


def _case_reasons(labels: list[str], errors: list[str | None]) -> list[str]:
    """One reason per distinct failure, naming the first case it happened on."""
    seen, out = set(), []
    for label, why in zip(labels, errors, strict=True):
        if why and why not in seen:
            seen.add(why)
            out.append(f"{label}: {why}")
    return out


def _fill(path: Path, cases: list[list], layouts: list[dict]) -> None:
    import torch

    mapping = channel.Mapping(path, writable=True)
    try:
        for case, spec in zip(cases, layouts, strict=True):
            for x, s in zip(case, spec["inputs"], strict=True):
                if isinstance(x, torch.Tensor):
                    mapping.tensor(s).copy_(x)
    finally:
        mapping.close()


def _sparse(path: Path, size: int) -> None:
    """A file of ``size`` bytes taking no disk until written (a job writes it through a mapping,
    which never extends a file)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def _check(work, layout, built: _Built, errors, runnable, device, reasons) -> bool:
    """Compare every replayed case's outputs in the channel with the reference's, and its inputs
    as they came back with those sent; each failure goes into ``reasons``, naming its case."""
    import torch

    mapping = channel.Mapping(work / channel.FILE, writable=False)
    correct = True
    failures: list[str | None] = list(errors)
    try:
        for i in runnable:
            if failures[i] is None:
                got = [mapping.tensor(s) for s in layout[i]["outputs"]]
                failures[i] = _compare(
                    [w.cpu() for w in built.expected[i]], got, device, built.scaled[i]
                )
            after = mapping.inputs(layout[i])
            if any(
                isinstance(b, torch.Tensor) and not torch.equal(b, a)
                for b, a in zip(built.inputs[i], after, strict=True)
            ):
                reasons.append(f"{built.labels[i]}: the program modified its inputs")
                correct = False
    finally:
        mapping.close()
    if any(failures):
        correct = False
    reasons += _case_reasons(built.labels, failures)
    return correct


def _outputs_not_made(programs: list) -> list[str]:
    """Each output the program did not make: an input's memory (returned as is, or a view of
    it; inputs that already hold the answer must not earn it), or a constant or parameter that no
    step of the program writes (a tensor the candidate's process computed outside its kernels:
    the replay can only return the bytes it held then)."""
    found = []
    for p in programs:
        written = {p.tensors[s["dst"] if "dst" in s else s["tensor"]]["storage"]
                   for s in p.steps if s["op"] != "launch"}  # fmt: skip
        written |= {
            p.tensors[arg["tensor"]]["storage"]
            for s in p.steps
            if s["op"] == "launch"
            for a in s["alternatives"]
            for arg in a.args.values()
            if "tensor" in arg
        }
        for i, t in enumerate(p.returned):
            index = p.tensors[t]["storage"]
            storage = p.storages[index]
            if storage["kind"] == "input":
                found.append(f"output {i} shares memory with input {storage['index']}")
            elif storage["kind"] in ("constant", "state") and index not in written:
                what = "a parameter" if storage["kind"] == "state" else "computed outside kernels"
                found.append(f"output {i} is not made by the program ({what})")
    return list(dict.fromkeys(found))


def _constants_read(programs: list) -> list[str]:
    """The launch arguments that are tensors the candidate's process made outside the program (a
    table, a scalar tensor, a cache): the replay holds no bytes of them, so a kernel that reads
    one reads uninitialised memory. Said where the outputs were wrong."""
    found = []
    for p in programs:
        for s in p.steps:
            for a in s.get("alternatives", []):
                for name, arg in sorted(a.args.items()):
                    if "tensor" in arg:
                        storage = p.storages[p.tensors[arg["tensor"]]["storage"]]
                        if storage["kind"] == "constant":
                            found.append(
                                f"argument {name} of kernel {a.name} is a tensor made outside "
                                "the program (by torch in the candidate's process): only "
                                "inputs, the model's parameters and buffers and what the program "
                                "writes carry values into a replay"
                            )
    return list(dict.fromkeys(found))


def _how(outcome: Outcome, timeout_s: float) -> str:
    if outcome.blocked:
        return (
            f"blocked itself past the wall-clock backstop of {sandbox.backstop_s(timeout_s):g} s "
            f"(it ran or waited for a CPU {outcome.runnable:.0%} of the time)"
        )
    if outcome.timed_out:
        return (
            f"ran past the wall-clock backstop of {sandbox.backstop_s(timeout_s):g} s "
            f"(starved by load) within its {timeout_s:g} CPU seconds"
        )
    if outcome.out_of_cpu:
        return f"ran out of its {timeout_s:g} CPU seconds"
    if outcome.returncode is None:
        return "the kernel fork server died"
    if outcome.returncode < 0:
        return f"killed by {signal.Signals(-outcome.returncode).name}"
    return f"exit {outcome.returncode}"


def _tail(stderr: str | None) -> str:
    tail = (stderr or "").strip().splitlines()[-3:]
    return ": " + " | ".join(tail) if tail else ""


def _harness(reasons: list[str], why: str) -> KernelResult:
    """The validator failed, not the candidate: no score (grading and GRPO leave it out)."""
    out = _result(False, False, False, reasons + [f"harness: {why}"])
    out.status = "harness"
    return out


def _timeout(reasons: list[str]) -> KernelResult:
    out = _result(False, False, False, reasons)
    out.status = "timeout"
    return out


def _result(
    compiled: bool,
    correct: bool,
    rule_ok: bool,
    reasons: list[str],
    launched: bool = False,
) -> KernelResult:
    exec_reward, rule_reward = float(correct), float(rule_ok)
    return KernelResult(
        exec_reward,
        rule_reward,
        exec_reward * rule_reward,
        compiled,
        correct,
        launched,
        None,
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
