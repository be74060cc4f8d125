"""The dual-reward validator end to end (extract, check, replay, judge): every reference solution
earns 1; every classic cheat earns 0, with a reason. The families of issue 26 (lazy outputs,
compute the recorder never sees, the check switched off, rules read from text) are in
test_cheat_families.py; honest Triton written in other ways in test_honest_kernels.py."""

import errno
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stillroom.config import ValidatorOptions
from stillroom.kernels import evaluate, validator

KERNELS = Path(__file__).resolve().parents[2] / "stillroom" / "kernels"
PROBLEMS = sorted((KERNELS / "problems").glob("*.py"))
RELU = (KERNELS / "problems" / "relu.py").read_text()

HEADER = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)


def launch(x, out):
    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
"""


def candidate(forward: str, prelude: str = "", init: str = "") -> str:
    """A relu ModelNew whose forward body is ``forward``."""
    body = textwrap.indent(textwrap.dedent(forward).strip(), " " * 8)
    init_body = textwrap.indent(textwrap.dedent(init).strip(), " " * 8) if init else ""
    return (
        HEADER
        + textwrap.dedent(prelude)
        + "\n\nclass ModelNew(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n"
        + (init_body + "\n" if init_body else "")
        + "\n    def forward(self, x):\n"
        + body
        + "\n"
    )


# A module-level dict carries the tensors into a kernel body: under Triton's interpreter the body
# is plain Python, so whatever it calls computes on the CPU.
STASH = """
STASH = {}
"""


def smuggling(kernel_body: str, prelude: str = "") -> str:
    """A relu whose launched kernel does nothing but ``kernel_body`` (with STASH holding x and the
    output)."""
    return candidate(
        """
        out = torch.empty_like(x)
        STASH["x"] = x
        STASH["out"] = out
        sneaky_kernel[(1,)](x, out, BLOCK=16)
        return STASH["out"]
        """,
        prelude=STASH
        + textwrap.dedent(prelude)
        + "\n\n@triton.jit\ndef sneaky_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):\n"
        + textwrap.indent(textwrap.dedent(kernel_body).strip(), "    ")
        + "\n",
    )


def launching(kernel_line: str, launch_line: str) -> str:
    """The honest relu with the kernel's ``tl.load`` line or its launch replaced."""
    return HONEST.replace("    x = tl.load(x_ptr + offs, mask=mask)", kernel_line).replace(
        "    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)",
        launch_line,
    )


HONEST = candidate("""
    x = x.contiguous()
    out = torch.empty_like(x)
    launch(x, out)
    return out
""")

NOT_MADE = "output 0 is not made by the program (computed outside kernels)"

# name -> (candidate source, a phrase the reasons must contain). Whatever the candidate's own
# process computes is at best a constant of the program: the fresh inputs make it stale.
CHEATS = {
    "torch does the work, no kernel": (
        HEADER.split("@triton.jit")[0] + "\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
        "        return torch.relu(x)\n",
        "no Triton kernel was launched",
    ),
    "kernel defined but never launched": (
        candidate("return torch.relu(x)"),
        "no Triton kernel was launched",
    ),
    "kernel launched, torch computes the answer": (
        candidate("out = torch.empty_like(x)\nlaunch(x, out)\nreturn torch.relu(x)"),
        NOT_MADE,
    ),
    "tensor method computes": (
        candidate("out = torch.empty_like(x)\nlaunch(x, out)\nreturn x.clamp(min=0)"),
        NOT_MADE,
    ),
    "operators compute": (
        candidate("out = torch.empty_like(x)\nlaunch(x, out)\nreturn x * (x > 0)"),
        NOT_MADE,
    ),
    "torch computes into the output a kernel then copies": (
        candidate("out = torch.empty_like(x)\nlaunch(torch.relu(x), out)\nreturn out"),
        "trial 0: output 0:",
    ),
    "a kernel writes zeros, torch writes the answer in place": (
        launching(
            "    x = tl.load(x_ptr + offs, mask=mask) * 0.0",
            "    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)\n"
            "    out.copy_(torch.relu(x))",
        ),
        "trial 0: output 0:",
    ),
    "module-level cache": (
        candidate(
            """
        global CACHE
        CACHE = CACHE if CACHE is not None else torch.empty_like(x)
        launch(x, CACHE)
        return CACHE
    """,
            prelude="CACHE = None",
        ),
        "outside every buffer passed to the launch",
    ),
    "input mutated in place": (
        candidate("launch(x, x)\nreturn x"),
        "the program modified its inputs",
    ),
    "comparison patched": (
        candidate(
            "return torch.empty_like(x)",
            prelude="""
        torch.allclose = lambda *a, **k: True
        torch.testing.assert_close = lambda *a, **k: None
        torch.isclose = torch.equal = lambda *a, **k: True
    """,
        ),
        # the replay and the comparison run in processes the patch never reaches: the output is
        # an allocation no kernel wrote
        "not written by a kernel store",
    ),
    "process exits": (candidate("raise SystemExit(0)"), "SystemExit"),
    "hangs": (candidate("while True:\n    pass"), "CPU seconds (running the candidate)"),
    "memory bomb": (candidate("hog = [0] * (1 << 32)\nreturn hog"), "MemoryError"),
    "reaches the reference": (candidate("return Model()(x)"), "NameError"),
    "reaches the reference through sys.modules": (
        candidate(
            "out = torch.empty_like(x)\nlaunch(x, out)\n"
            "return [m for m in list(sys.modules.values())\n"
            "        if str(getattr(m, '__file__', '')).endswith('problem.py')][0].Model()(x)",
            prelude="import sys",
        ),
        "IndexError",
    ),
    "getattr trick": (
        candidate("launch(x, torch.empty_like(x))\nreturn getattr(torch, 're' + 'lu')(x)"),
        NOT_MADE,
    ),
    "eval trick": (
        candidate("launch(x, torch.empty_like(x))\nreturn eval('torch.relu')(x)"),
        NOT_MADE,
    ),
    "numpy computes": (
        candidate(
            "launch(x, torch.empty_like(x))\nreturn torch.from_numpy(np.maximum(x.numpy(), 0))",
            prelude="import numpy as np",
        ),
        NOT_MADE,
    ),
    "subprocess": (
        candidate("subprocess.run(['true'])\nreturn x", prelude="import subprocess"),
        "not allowed",
    ),
    "code at import time": (
        candidate("return x", prelude="torch.save(torch.zeros(1), 'leak.pt')"),
        "failed at import",
    ),
    "writes a file from C": (
        candidate("torch.save(x, 'leak.pt')\nreturn x"),
        "trial 0: RuntimeError",
    ),
    "writes a file from Python (the audit hook refuses)": (
        candidate(
            "f = self.opener('leak.txt', 'w')\nreturn x", init="self.opener = __builtins__['open']"
        ),
        "leak.txt for writing (or a directory) outside the box is not allowed",
    ),
    # signal 0: harmless if it got through
    "signals the process that started it (the audit hook refuses)": (
        candidate("torch.os.killpg(torch.os.getpgid(torch.os.getppid()), 0)\nreturn x"),
        "sandbox: os.killpg is not allowed",
    ),
    "torch inside the kernel body": (
        HONEST.replace(
            "tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)",
            "tl.store(out_ptr + offs, torch.relu(x), mask=mask)",
        ),
        "uses torch (module torch): a kernel uses triton.language only",
    ),
    "leaves an output element unwritten": (
        HONEST.replace("offs < n", "(offs < n) & (offs > 0)"),
        "trial 0:",
    ),
    "wrong answer": (HONEST.replace("tl.maximum(x, 0.0)", "tl.maximum(x, 0.1)"), "elements off"),
    "kernel body calls a module-level helper that runs torch": (
        smuggling(
            "smuggle()",
            prelude="""
        def smuggle():
            STASH["out"].copy_(torch.relu(STASH["x"]))
        """,
        ),
        "kernel sneaky_kernel, line 3: uses smuggle (function)",
    ),
    "kernel body calls torch under another name": (
        smuggling('STASH["out"] = G.relu(STASH["x"])', prelude="import torch.nn.functional as G"),
        "uses STASH (dict)",
    ),
    "kernel body calls torch imported by name": (
        smuggling("relu(x_ptr)", prelude="from torch import relu"),
        "uses relu (builtin_function_or_method)",
    ),
    "kernel body calls a lambda bound at module level": (
        smuggling("FN(x_ptr)", prelude="FN = lambda t: t.clamp(min=0)"),
        "uses FN (function)",
    ),
    "kernel body reads the interpreter's numpy": (
        smuggling("tl.store(out_ptr, tl.load(x_ptr).handle.data)"),
        "uses .handle of a value",
    ),
    "kernel body reads a dunder": (
        smuggling("tl.store(out_ptr, tl.load(x_ptr).__class__)"),
        "uses .__class__",
    ),
    "kernel body reaches triton's knobs": (
        smuggling("tl.core.knobs.runtime.launch_enter_hook(x_ptr)"),
        "triton.language.core.knobs is not part of triton.language",
    ),
    "kernel body defines a function": (
        smuggling("f = lambda v: v\ntl.store(out_ptr, f(tl.load(x_ptr)))"),
        "Lambda is not allowed",
    ),
    "forward calls torch under another name": (
        candidate(
            "out = torch.empty_like(x)\nlaunch(x, out)\nreturn G.relu(x)",
            prelude="import torch.nn.functional as G",
        ),
        NOT_MADE,
    ),
    "a torch submodule called from forward": (
        candidate(
            "out = torch.empty_like(x)\nlaunch(x, out)\nreturn self.act(x)",
            init="self.act = nn.ReLU()",
        ),
        NOT_MADE,
    ),
    "reaches sys through typing": (
        candidate("typing.sys.exit(0)\nreturn x", prelude="import typing"),
        "SystemExit",
    ),
    "numpy reached through torch.nn.functional": (
        candidate(
            "launch(x, torch.empty_like(x))\nreturn torch.from_numpy(G.np.maximum(x.numpy(), 0))",
            prelude="import torch.nn.functional as G",
        ),
        NOT_MADE,
    ),
    "block size above the limit": (
        launching(
            "    x = tl.load(x_ptr + offs, mask=mask)",
            "    relu_kernel[(triton.cdiv(x.numel(), 4096),)](x, out, x.numel(), BLOCK=4096)",
        ),
        "block size BLOCK=4096 exceeds 2048",
    ),
    "block size not a power of two": (
        launching(
            "    x = tl.load(x_ptr + offs, mask=mask)",
            "    relu_kernel[(triton.cdiv(x.numel(), 1000),)](x, out, x.numel(), BLOCK=1000)",
        ),
        "block size BLOCK=1000 is not a power of two",
    ),
    "num_warps=64": (
        launching(
            "    x = tl.load(x_ptr + offs, mask=mask)",
            "    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024, "
            "num_warps=64)",
        ),
        "num_warps=64 is 2048 threads per block, more than 1024",
    ),
    # correct, but each program takes every P-th element: no lane reads next to its neighbour
    "strided-only load and store": (
        HONEST.replace(
            "offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
            "offs = tl.arange(0, BLOCK) * tl.num_programs(0) + tl.program_id(0)",
        ),
        "tl.load has no unit-stride axis",
    ),
    "unrolled huge kernel": (
        launching(
            "    x = tl.load(x_ptr + offs, mask=mask)\n"
            "    for i in tl.static_range(1000):\n"
            "        x = tl.maximum(x * 1.0 + 0.0, x)",
            "    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)",
        ),
        "instructions per program",
    ),
}


def test_honest_candidate_earns_full_reward():
    r = evaluate(RELU, HONEST)
    assert (r.reward, r.exec_reward, r.rule_reward, r.compiled, r.correct, r.launched_triton) == (
        1,
        1,
        1,
        1,
        1,
        1,
    )
    assert r.speedup is None  # timed on GPU only
    assert r.status == "scored" and isinstance(r.replay_seed, int)
    assert r.program == ["launch relu_kernel grid (4,) BLOCK=1024 num_warps=4"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CHEATS))
def test_cheat_earns_nothing(name):
    source, why = CHEATS[name]
    r = evaluate(RELU, source, timeout_s=20)
    # charged to the candidate, never to the harness (a loaded machine may time a slow one out)
    assert r.reward == 0 and r.status != "harness", (name, r)
    assert r.status == "timeout" or name != "hangs", r
    assert any(why in reason for reason in r.reasons), (name, r.reasons)


def test_a_rule_failure_zeroes_a_correct_result():
    r = evaluate(RELU, CHEATS["num_warps=64"][0])
    assert (r.exec_reward, r.rule_reward, r.reward, r.launched_triton) == (1.0, 0.0, 0.0, True)


@pytest.mark.parametrize(
    ("name", "forward", "prelude", "init"),
    [
        (
            "a fallback that never ran",
            "try:\n    out = torch.empty_like(x)\n    launch(x, out)\n    return out\n"
            "except Exception:\n    return torch.relu(x)",
            "",
            "",
        ),
        ("a finalizer", "out = torch.empty_like(x)\nlaunch(x, out)\nreturn out", "", ""),
        (
            "scalar math and torch on the side, unused",
            "c = math.sqrt(2.0 / math.pi) * float(x.abs().sum() > -1)\nout = torch.empty_like(x)\n"
            "launch(x, out)\nreturn out",
            "import math",
            "",
        ),
        (
            "the recorder muted, torch writes the output, the kernel then overwrites it",
            'recorder = torch.sys.modules["stillroom.kernels.extract"]._recorder[-1]\n'
            "recorder.muted += 1\nout = torch.empty_like(x)\nout.copy_(torch.relu(x))\n"
            "launch(x, out)\nreturn out",
            "",
            "",
        ),
        (
            "an output cached across calls",
            "if self.cache is None or self.cache.shape != x.shape:\n"
            "    self.cache = torch.empty_like(x)\nlaunch(x.contiguous(), self.cache)\n"
            "return self.cache",
            "",
            "self.cache = None",
        ),
    ],
)
def test_what_the_program_does_not_contain_does_not_matter(name, forward, prelude, init):
    """A fallback, a finalizer, torch work whose result goes nowhere, a cache: none of it is part
    of the program that was replayed, which computes the op with Triton on fresh inputs."""
    source = candidate(forward, prelude=prelude, init=init)
    if name == "a finalizer":
        source += "\n    def __del__(self):\n        pass\n"
    r = evaluate(RELU, source)
    assert r.reward == 1, (name, r.reasons)


@pytest.mark.slow
def test_every_reference_solution_earns_full_reward():
    def score(path):
        return path.stem, evaluate(
            path.read_text(), (KERNELS / "solutions" / path.name).read_text(), trials=2
        )

    with ThreadPoolExecutor(2) as pool:  # each job is its own process, forked by one server
        results = dict(pool.map(score, PROBLEMS))
    assert {name: r.reasons for name, r in results.items() if r.reward != 1.0} == {}


def test_process_isolation_scores_alike():
    assert evaluate(RELU, HONEST, isolation="process").reward == 1
    source, why = CHEATS["writes a file from C"]
    r = evaluate(RELU, source, isolation="process")
    assert r.reward == 0 and any(why in reason for reason in r.reasons), r.reasons


@pytest.mark.parametrize("isolation", ["fork", "process"])
def test_a_process_ending_without_a_record_is_reported_with_its_stderr(isolation):
    source = candidate(
        "torch.sys.stderr.write('boom\\n')\ntorch.sys.stderr.flush()\ntorch.os._exit(3)"
    )
    r = evaluate(RELU, source, isolation=isolation)
    assert r.reward == 0 and r.status == "scored"
    assert any(
        "ended (exit 3) without a readable record" in why and "boom" in why for why in r.reasons
    ), r.reasons


def test_an_unknown_isolation_is_refused():
    with pytest.raises(ValueError, match="isolation must be one of fork, process"):
        evaluate(RELU, HONEST, isolation="thread")


def test_an_output_that_is_its_input_is_refused():
    """On inputs that already hold the answer (ReLU of non-negative numbers) a do-nothing launch
    and ``return x`` would match: an output must not be an input's memory."""
    positive = RELU.replace("torch.randn(16, 256)", "torch.rand(16, 256)")
    source = candidate("launch(x, torch.empty_like(x))\nreturn x.view_as(x)")
    r = evaluate(positive, source, cases=[])  # the trials alone: the generated cases fail it too
    assert r.exec_reward == 1 and r.reward == 0, r
    assert "output 0 shares memory with input 0" in r.reasons, r.reasons


def test_the_inputs_come_from_the_replay_seed_recorded_in_the_result():
    """A result can be reproduced: the same replay seed draws the same cases, a fresh one others
    (so no candidate can know them)."""
    wrong = CHEATS["wrong answer"][0]
    first = evaluate(RELU, wrong, cases=["mixed_sign"])
    again = evaluate(RELU, wrong, cases=["mixed_sign"], replay_seed=first.replay_seed)
    other = evaluate(RELU, wrong, cases=["mixed_sign"], replay_seed=first.replay_seed + 1)
    assert again.reasons == first.reasons and again.replay_seed == first.replay_seed
    assert other.reasons != first.reasons


def test_launch_limits_come_from_the_options():
    """The kernels: config section reaches the launch rules (reward.py passes every option)."""
    options = ValidatorOptions(trials=1, max_block_size=512, max_instructions=5)
    r = evaluate(RELU, HONEST, **options.model_dump())
    assert r.exec_reward == 1 and r.rule_reward == 0, r
    assert "kernel relu_kernel: block size BLOCK=1024 exceeds 512" in r.reasons, r.reasons
    assert any(why.endswith("more than 5") for why in r.reasons), r.reasons


def test_a_job_lost_before_it_started_is_the_harness_not_the_candidate(monkeypatch):
    """Not started: whatever ended the job (killed while loading, a fork server that died first,
    a timeout while loading) happened before any candidate code ran."""
    from stillroom.kernels.isolation import Outcome

    for outcome, how in (
        (Outcome(False, -9, "", False), "killed by SIGKILL"),
        (Outcome(False, None, "", False), "the kernel fork server died"),
        (
            Outcome(True, -9, "", False),
            "ran past the wall-clock backstop of 630 s (starved by load) within its 60 CPU seconds",
        ),
    ):
        monkeypatch.setitem(validator.ISOLATIONS, "fork", lambda *a, outcome=outcome: outcome)
        r = evaluate(RELU, HONEST)
        assert (r.status, r.reward) == ("harness", 0.0), r
        assert r.reasons == [
            f"harness: the extraction ended ({how}) before the candidate started"
        ], r.reasons


def test_a_sandbox_that_cannot_start_is_an_error_not_a_harness_grade(monkeypatch):
    from stillroom.kernels.isolation import SandboxError

    def no_server(*args):
        raise SandboxError("the kernel fork server for device 'cpu' failed to start (exit 1)")

    monkeypatch.setitem(validator.ISOLATIONS, "fork", no_server)
    with pytest.raises(SandboxError, match="failed to start"):
        evaluate(RELU, HONEST)


def test_the_validator_out_of_memory_is_the_harness():
    problem = RELU.replace("return [torch.randn(16, 256)]", "raise MemoryError('no room')")
    r = evaluate(problem, HONEST)
    assert r.status == "harness" and "out of memory building the inputs" in r.reasons[0], r


def test_a_channel_that_cannot_be_created_is_the_harness(monkeypatch):
    def full(path, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(validator.channel, "create", full)
    r = evaluate(RELU, HONEST)
    assert r.status == "harness" and "files could not be written" in r.reasons[0], r


def test_a_job_the_extraction_cannot_load_is_the_harness(monkeypatch):
    """A real extraction, through the fork server, that fails before any candidate code runs."""
    import torch

    monkeypatch.setattr(torch, "save", lambda obj, path: Path(path).write_bytes(b"not a job"))
    r = evaluate(RELU, HONEST)
    assert r.status == "harness", r
    assert r.reasons[0].startswith("harness: the extraction ended (exit 1) before the candidate"), r


@pytest.mark.parametrize("bad", [-1, 2**62, 1.5, True, "7"])
def test_a_replay_seed_out_of_range_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="replay_seed must be an integer in"):
        evaluate(RELU, HONEST, replay_seed=bad)
