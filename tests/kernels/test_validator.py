"""The dual-reward validator: every reference solution earns 1; every cheat earns 0, with a
reason."""

import errno
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stillroom.kernels import evaluate, validator
from stillroom.kernels.rules import check

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


HONEST = candidate("""
    x = x.contiguous()
    out = torch.empty_like(x)
    launch(x, out)
    return out
""")

# name -> (candidate source, a phrase the reasons must contain)
CHEATS = {
    "torch does the work, no kernel": (
        HEADER.split("@triton.jit")[0] + "\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
        "        return torch.relu(x)\n",
        "no @triton.jit kernel",
    ),
    "kernel defined but never launched": (candidate("return torch.relu(x)"), "never launches"),
    "kernel launched, torch computes the answer": (
        candidate("out = torch.empty_like(x)\nlaunch(x, out)\nreturn torch.relu(x)"),
        "torch.relu",
    ),
    "tensor method computes": (
        candidate("out = torch.empty_like(x)\nlaunch(x, out)\nreturn x.clamp(min=0)"),
        ".clamp()",
    ),
    "operators compute (only the run-time check sees it)": (
        candidate("out = torch.empty_like(x)\nlaunch(x, out)\nreturn x * (x > 0)"),
        "torch computed outside Triton",
    ),
    "try/except fallback": (
        candidate("""
        try:
            out = torch.empty_like(x)
            launch(x, out)
            return out
        except Exception:
            return torch.relu(x)
    """),
        "try/except",
    ),
    "output cached across calls": (
        candidate(
            """
        if self.cache is None:
            self.cache = torch.empty_like(x)
            launch(x.contiguous(), self.cache)
        return self.cache
    """,
            init="self.cache = None",
        ),
        "trial 1:",
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
        "global",
    ),
    "input mutated in place": (candidate("launch(x, x)\nreturn x"), "modified its inputs"),
    "comparison patched": (
        candidate(
            "return torch.empty_like(x)",
            prelude="""
        torch.allclose = lambda *a, **k: True
        torch.testing.assert_close = lambda *a, **k: None
    """,
        ),
        "patching a library",
    ),
    "process exits": (candidate("raise SystemExit(0)"), "SystemExit"),
    "hangs": (candidate("while True:\n    pass"), "timed out"),
    "memory bomb": (candidate("hog = [0] * (1 << 32)\nreturn hog"), "MemoryError"),
    "reaches the reference": (candidate("return Model()(x)"), "uses Model"),
    "reaches the reference through sys.modules": (
        candidate("return sys.modules['problem'].Model()(x)", prelude="import sys"),
        "imports sys",
    ),
    "getattr trick": (candidate("return getattr(torch, 're' + 'lu')(x)"), "uses getattr"),
    "eval trick": (candidate("return eval('torch.relu')(x)"), "uses eval"),
    "numpy computes": (
        candidate(
            "return torch.from_numpy(np.maximum(x.numpy(), 0))", prelude="import numpy as np"
        ),
        "imports numpy",
    ),
    "subprocess": (
        candidate("subprocess.run(['true'])\nreturn x", prelude="import subprocess"),
        "imports subprocess",
    ),
    "code at import time": (
        candidate("return x", prelude="torch.save(torch.zeros(1), 'leak.pt')"),
        "code at module or class level",
    ),
    "writes a file from C (RLIMIT_FSIZE 0 stops it)": (
        candidate("torch.save(x, 'leak.pt')\nreturn x"),
        "failed at forward: RuntimeError",
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
    "finalizer runs after the checks": (
        HONEST + "\n    def __del__(self):\n        pass\n",
        "defines __del__",
    ),
    "torch inside the kernel body": (
        HONEST.replace(
            "tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)",
            "tl.store(out_ptr + offs, torch.relu(x), mask=mask)",
        ),
        "inside a Triton kernel",
    ),
    "leaves an output element unwritten": (
        HONEST.replace("offs < n", "(offs < n) & (offs > 0)"),
        "trial 0:",
    ),
    "wrong answer": (HONEST.replace("tl.maximum(x, 0.0)", "tl.maximum(x, 0.1)"), "elements off"),
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
    assert r.status == "scored"


@pytest.mark.parametrize("name", list(CHEATS))
def test_cheat_earns_nothing(name):
    source, why = CHEATS[name]
    r = evaluate(RELU, source, timeout_s=20)
    # charged to the candidate, never to the harness (a loaded machine may time a slow one out)
    assert r.reward == 0 and r.status != "harness", (name, r)
    assert r.status == "timeout" or name != "hangs", r
    assert any(why in reason for reason in r.reasons), (name, r.reasons)


def test_code_inside_a_launch_writes_nowhere_outside_the_launch_directory(tmp_path):
    """In Triton's interpreter the kernel body runs as Python inside the launch, where Triton's
    own code may write its cache: the candidate must not reach any other file from there."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    for attack in (f"os.remove({str(victim)!r})", f"open({str(tmp_path / 'new.txt')!r}, 'w')"):
        source = candidate(
            "out = torch.empty_like(x)\nevil_kernel[(1,)](x, BLOCK=4)\nlaunch(x, out)\nreturn out",
            prelude=f"""
        import os


        @triton.jit
        def evil_kernel(x_ptr, BLOCK: tl.constexpr):
            {attack}
        """,
        )
        r = evaluate(RELU, source, timeout_s=30)
        assert r.reward == 0 and any("sandbox:" in reason for reason in r.reasons), r.reasons
    assert victim.read_text() == "keep me" and not (tmp_path / "new.txt").exists()


def test_a_rule_failure_zeroes_a_correct_result():
    r = evaluate(RELU, CHEATS["kernel launched, torch computes the answer"][0])
    assert (r.exec_reward, r.rule_reward, r.reward, r.launched_triton) == (1.0, 0.0, 0.0, True)


def test_static_rules_accept_every_reference_solution():
    for path in sorted((KERNELS / "solutions").glob("*.py")):
        assert check(path.read_text()) == [], path.name


def test_every_reference_solution_earns_full_reward():
    def score(path):
        return path.stem, evaluate(
            path.read_text(), (KERNELS / "solutions" / path.name).read_text(), trials=2
        )

    with ThreadPoolExecutor(2) as pool:  # each evaluation is its own process, forked by one server
        results = dict(pool.map(score, PROBLEMS))
    assert {name: r.reasons for name, r in results.items() if r.reward != 1.0} == {}


def test_process_isolation_scores_alike():
    assert evaluate(RELU, HONEST, isolation="process").reward == 1
    source, why = CHEATS["writes a file from C (RLIMIT_FSIZE 0 stops it)"]
    r = evaluate(RELU, source, isolation="process")
    assert r.reward == 0 and any(why in reason for reason in r.reasons), r.reasons


@pytest.mark.parametrize("isolation", ["fork", "process"])
def test_a_process_ending_without_a_result_is_reported_with_its_stderr(isolation):
    source = candidate(
        "torch.sys.stderr.write('boom\\n')\ntorch.sys.stderr.flush()\ntorch.os._exit(3)"
    )
    r = evaluate(RELU, source, isolation=isolation)
    assert r.reward == 0
    assert any(
        "ended (exit 3) without a readable result" in why and "boom" in why for why in r.reasons
    ), r.reasons


def test_an_unknown_isolation_is_refused():
    with pytest.raises(ValueError, match="isolation must be one of fork, process"):
        evaluate(RELU, HONEST, isolation="thread")


def test_a_worker_lost_before_the_candidate_started_is_the_harness_not_the_candidate(monkeypatch):
    """No "started" file: whatever ended the worker (killed while loading its job, a fork server
    that died first, a timeout while loading) happened before any candidate code ran."""
    for outcome, how in (
        ((False, -9, ""), "killed by SIGKILL"),
        ((False, None, ""), "the kernel fork server died"),
        ((True, -9, ""), "timed out after 60 s"),
    ):
        monkeypatch.setitem(validator.ISOLATIONS, "fork", lambda *a, outcome=outcome: outcome)
        r = evaluate(RELU, HONEST)
        assert (r.status, r.reward) == ("harness", 0.0), r
        assert r.reasons == [f"harness: the worker ended ({how}) before the candidate started"]

    def no_server(*args):
        raise RuntimeError("the kernel fork server for device 'cpu' failed to start (exit 1)")

    monkeypatch.setitem(validator.ISOLATIONS, "fork", no_server)
    r = evaluate(RELU, HONEST)
    assert r.status == "harness" and "could not be started" in r.reasons[0], r


def test_the_validator_out_of_memory_is_the_harness():
    problem = RELU.replace("return [torch.randn(16, 256)]", "raise MemoryError('no room')")
    r = evaluate(problem, HONEST)
    assert r.status == "harness" and "out of memory building the inputs" in r.reasons[0], r


def test_a_channel_that_cannot_be_created_is_the_harness(monkeypatch):
    def full(path, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(validator.channel, "create", full)
    r = evaluate(RELU, HONEST)
    assert r.status == "harness" and "data channel could not be created" in r.reasons[0], r


def test_a_job_the_worker_cannot_load_is_the_harness(monkeypatch):
    """A real worker, through the fork server, that fails before any candidate code runs."""
    import torch

    monkeypatch.setattr(torch, "save", lambda obj, path: Path(path).write_bytes(b"not a job"))
    r = evaluate(RELU, HONEST)
    assert r.status == "harness", r
    assert r.reasons[0].startswith("harness: the worker ended (exit 1) before the candidate"), r
