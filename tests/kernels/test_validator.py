"""The dual-reward validator: every reference solution earns 1; every cheat earns 0, with a
reason."""

import errno
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stillroom.config import ValidatorOptions
from stillroom.kernels import evaluate, validator
from stillroom.kernels.rules import check, launch_rules

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
    "kernel body calls a module-level helper that runs torch": (
        smuggling(
            "smuggle()",
            prelude="""
        def smuggle():
            STASH["out"].copy_(torch.relu(STASH["x"]))
        """,
        ),
        "kernel sneaky_kernel, line",
    ),
    "kernel body calls torch under another name": (
        smuggling('STASH["out"] = G.relu(STASH["x"])', prelude="import torch.nn.functional as G"),
        "calls G.relu",
    ),
    "kernel body calls torch imported by name": (
        smuggling('STASH["out"] = relu(STASH["x"])', prelude="from torch import relu"),
        "calls relu",
    ),
    "kernel body calls a lambda bound at module level": (
        smuggling('STASH["out"] = FN(STASH["x"])', prelude="FN = lambda t: t.clamp(min=0)"),
        "calls FN",
    ),
    "kernel body calls through a subscript": (
        smuggling('STASH["out"] = STASH["fn"](STASH["x"])'),
        "calls STASH['fn']",
    ),
    "forward calls torch under another name": (
        candidate(
            "out = torch.empty_like(x)\nlaunch(x, out)\nreturn G.relu(x)",
            prelude="import torch.nn.functional as G",
        ),
        "calls G.relu (torch.nn.functional.relu)",
    ),
    "forward calls torch imported by name": (
        candidate(
            "out = torch.empty_like(x)\nlaunch(x, out)\nreturn relu(x)",
            prelude="from torch import relu",
        ),
        "calls relu (torch.relu)",
    ),
    "torch function handed on, called under a local name": (
        candidate("out = torch.empty_like(x)\nlaunch(x, out)\nact = torch.relu\nreturn act(x)"),
        "refers to torch.relu",
    ),
    "a helper handed on, then called": (
        candidate(
            "out = torch.empty_like(x)\nlaunch(x, out)\nact = helper\nreturn act(x)",
            prelude="def helper(t):\n    return t.clamp(min=0)\n",
        ),
        "helper, line",
    ),
    "a torch submodule called from forward": (
        candidate(
            "out = torch.empty_like(x)\nlaunch(x, out)\nreturn self.act(x)",
            init="self.act = nn.ReLU()",
        ),
        "calls self.act (a submodule",
    ),
    "math on a tensor (only the run-time audit sees it)": (
        candidate(
            "out = torch.empty_like(x)\nlaunch(x, out)\nc = math.fsum(x[0])\nreturn out",
            prelude="import math",
        ),
        "torch computed outside Triton",
    ),
    "reaches the worker through torch.sys and hides torch from the audit": (
        candidate(
            """
        state = torch.sys.modules["stillroom.kernels.worker"]._State
        state.in_launch += 1
        out = torch.add(x.clamp(min=0), 0)
        launch(x, torch.empty_like(x))
        return out
        """
        ),
        "uses torch.sys",
    ),
    "reaches sys through typing": (
        candidate("typing.sys.exit(0)\nreturn x", prelude="import typing"),
        "uses typing.sys (.sys leads to the interpreter's internals)",
    ),
    "numpy reached through torch.nn.functional": (
        candidate(
            "launch(x, torch.empty_like(x))\nreturn torch.from_numpy(G.np.maximum(x, 0))",
            prelude="import torch.nn.functional as G",
        ),
        "uses G.np (.np leads to the interpreter",
    ),
    "walks a generator's frame to the caller's globals": (
        candidate(
            "g = (i for i in [0])\nframe = g.gi_frame\nreturn x",
        ),
        ".gi_frame leads to the interpreter's internals",
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
        "instructions (static estimate, loops unrolled), more than 2000",
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


def test_an_output_that_is_its_input_is_refused():
    """On inputs that already hold the answer (ReLU of non-negative numbers) a do-nothing launch
    and ``return x`` would match: the worker refuses outputs sharing memory with an input."""
    positive = RELU.replace("torch.randn(16, 256)", "torch.rand(16, 256)")
    source = candidate("launch(x, torch.empty_like(x))\nreturn x.view_as(x)")
    r = evaluate(positive, source, cases=[])  # the trials alone: the generated cases fail it too
    assert r.exec_reward == 1 and r.reward == 0, r
    assert "output 0 shares memory with input 0" in r.reasons, r.reasons


@pytest.mark.parametrize(
    "name",
    [
        "kernel body calls a module-level helper that runs torch",
        "kernel body calls torch under another name",
        "reaches the worker through torch.sys and hides torch from the audit",
    ],
)
def test_the_run_time_audit_alone_catches_smuggled_torch(name, monkeypatch):
    """With the static rules switched off, torch called from a kernel body (or with the launch
    counter flipped) is still torch compute: only Triton's own calls inside a launch are
    exempt."""
    monkeypatch.setattr(validator.rules, "check", lambda src: [])
    r = evaluate(RELU, CHEATS[name][0], timeout_s=30)
    assert r.reward == 0, r
    assert any("torch computed outside Triton" in why for why in r.reasons), r.reasons


def test_scalar_math_in_host_code_is_allowed():
    source = candidate(
        """
        c = math.sqrt(2.0 / math.pi) * m.sqrt(4.0) / sqrt(1.0)
        if abs(c - round(c, 3)) > 1.0 or float(max(c, 1)) < 1:
            raise ValueError(c)
        out = torch.empty_like(x)
        launch(x, out)
        return out
        """,
        prelude="import math\nimport math as m\nfrom math import sqrt",
    )
    assert check(source) == []
    assert evaluate(RELU, source).reward == 1


def test_kernels_call_triton_language_under_any_alias():
    # calls through L; the annotation stays tl.constexpr, which Triton's interpreter looks for
    aliased = (
        HONEST.replace(
            "import triton.language as tl",
            "import triton.language as tl\nfrom triton import jit, language as L",
        )
        .replace("@triton.jit", "@jit")
        .replace("tl.", "L.")
        .replace("L.constexpr", "tl.constexpr")
    )
    assert "@jit" in aliased and "L.load(" in aliased and check(aliased) == []
    assert evaluate(RELU, aliased, trials=1).reward == 1
    # compiled Triton takes a from-import too (its interpreter does not patch one, so no run here)
    imported = aliased.replace("L.arange(0, BLOCK)", "arange(0, BLOCK)").replace(
        "import triton\n", "import triton\nfrom triton.language import arange\n", 1
    )
    assert "arange(0, BLOCK)" in imported and check(imported) == []


RECORD = {
    "kernel": "relu_kernel",
    "constexprs": {"BLOCK": 1024},
    "ints": {"n": 4096},
    "num_warps": 4,
}
LIMITS = {"max_block_size": 2048, "max_threads_per_block": 1024, "max_instructions": 2000}


def test_launch_rules_pass_the_honest_launch():
    assert launch_rules(HONEST, [RECORD], **LIMITS) == []


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"constexprs": {"BLOCK": 4096}}, "kernel relu_kernel: block size BLOCK=4096 exceeds 2048"),
        (
            {"constexprs": {"BLOCK": 96}},
            "kernel relu_kernel: block size BLOCK=96 is not a power of two",
        ),
        (
            {"num_warps": 64},
            "kernel relu_kernel: num_warps=64 is 2048 threads per block, more than 1024",
        ),
    ],
)
def test_launch_rules_wording(change, reason):
    assert launch_rules(HONEST, [{**RECORD, **change}], **LIMITS) == [reason]


def test_block_sizes_are_found_by_name_and_by_tl_arange():
    source = HONEST.replace("BLOCK: tl.constexpr", "BLOCK: tl.constexpr, WIDTH: tl.constexpr")
    source = source.replace("tl.arange(0, BLOCK)", "tl.arange(0, WIDTH)")
    record = {**RECORD, "constexprs": {"BLOCK": 1024, "WIDTH": 24, "GROUPS": 3}}
    assert launch_rules(source, [record], **LIMITS) == [
        "kernel relu_kernel: block size WIDTH=24 is not a power of two"
    ]


def test_instruction_estimate_unrolls_constexpr_loops():
    loop = "    for i in range(0, REPS):\n        x = x * 1.0 + 0.0\n"
    source = HONEST.replace("BLOCK: tl.constexpr", "BLOCK: tl.constexpr, REPS: tl.constexpr")
    source = source.replace("    tl.store(", loop + "    tl.store(")
    small = {**RECORD, "constexprs": {"BLOCK": 1024, "REPS": 10}}
    large = {**RECORD, "constexprs": {"BLOCK": 1024, "REPS": 1000}}
    assert launch_rules(source, [small], **LIMITS) == []
    (reason,) = launch_rules(source, [large], **LIMITS)
    assert reason.startswith("kernel relu_kernel: about 20") and "more than 2000" in reason


@pytest.mark.parametrize(
    ("offsets", "ints", "ok"),
    [
        ("offs", {}, True),
        ("offs * 2", {}, False),
        ("offs * s", {"s": 1}, True),
        ("offs * s", {"s": 3}, False),
        ("(offs // 2) * 64 + offs % 2", {}, True),
        ("(offs // 2) * 64", {}, False),
        ("(offs // 64) % 4", {}, True),  # a broadcast: lanes share addresses
        ("tl.program_id(0)", {}, True),  # a scalar: nothing to coalesce
    ],
)
def test_coalescing(offsets, ints, ok):
    source = HONEST.replace("x_ptr, out_ptr, n,", "x_ptr, out_ptr, n, s,").replace(
        "tl.load(x_ptr + offs, mask=mask)", f"tl.load(x_ptr + {offsets})"
    )
    found = launch_rules(source, [{**RECORD, "ints": {"n": 4096, **ints}}], **LIMITS)
    if ok:
        assert found == []
    else:
        assert found == [
            "kernel relu_kernel, line 12: tl.load has no unit-stride axis: every tl.arange in its "
            "offsets is scaled (uncoalesced)"
        ]


def test_block_pointers_need_a_unit_stride():
    load = (
        "    p = tl.make_block_ptr(x_ptr, (n,), ({stride},), (0,), (BLOCK,), (0,))\n"
        "    x = tl.load(tl.advance(p, (BLOCK,)))"
    )
    for stride, ok in (("1", True), ("s", True), ("2", False)):
        source = HONEST.replace("x_ptr, out_ptr, n,", "x_ptr, out_ptr, n, s,").replace(
            "    x = tl.load(x_ptr + offs, mask=mask)", load.format(stride=stride)
        )
        found = launch_rules(source, [{**RECORD, "ints": {"n": 64, "s": 1}}], **LIMITS)
        assert (found == []) == ok, (stride, found)


def test_launch_limits_come_from_the_options():
    """The kernels: config section reaches the launch rules (reward.py passes every option)."""
    options = ValidatorOptions(trials=1, max_block_size=512, max_instructions=5)
    r = evaluate(RELU, HONEST, **options.model_dump())
    assert r.exec_reward == 1 and r.rule_reward == 0, r
    assert "kernel relu_kernel: block size BLOCK=1024 exceeds 512" in r.reasons, r.reasons
    assert any(why.endswith("more than 5") for why in r.reasons), r.reasons


def test_autotuned_launches_are_recorded_with_their_config():
    source = HONEST.replace(
        "@triton.jit",
        "@triton.autotune(configs=[triton.Config({'BLOCK': 1024}, num_warps=64)], key=['n'])\n"
        "@triton.jit",
    ).replace(", BLOCK=1024)", ")")
    r = evaluate(RELU, source, trials=1)
    assert r.exec_reward == 1 and r.reward == 0, r
    assert r.reasons == [
        "kernel relu_kernel: num_warps=64 is 2048 threads per block, more than 1024"
    ], r.reasons


def test_attribute_chains_are_walked_on_the_real_modules():
    """A module of another package reached from an allowed one is refused whatever its attribute
    is called (the names of PATH_ATTRS are only the known ones)."""
    from stillroom.kernels.rules import _module_reached

    assert _module_reached("typing.sys") == "sys"
    assert _module_reached("torch.nn.functional.np") == "numpy"
    assert _module_reached("torch.nn.functional") is None
    assert _module_reached("torch.relu") is None


def test_a_launch_record_holds_constexprs_defaults_ints_and_num_warps():
    import torch
    import triton
    import triton.language as tl

    from stillroom.kernels.worker import _launch_record

    @triton.jit
    def k(x_ptr, n, s, BLOCK: tl.constexpr, TILE: tl.constexpr = 4096):
        pass

    assert _launch_record(k, (torch.zeros(3), 3, 1), {"BLOCK": 64, "num_warps": 8}) == {
        "kernel": "k",
        "constexprs": {"BLOCK": 64, "TILE": 4096},
        "ints": {"n": 3, "s": 1},
        "num_warps": 8,
    }
    assert _launch_record(k, (torch.zeros(3), 3, 1, 32), {})["num_warps"] == 4


def test_aliases_name_each_output_sharing_an_inputs_memory():
    import torch

    from stillroom.kernels.worker import _aliases

    x, y = torch.zeros(4, 4), torch.zeros(4)
    assert _aliases((x.t(), torch.zeros(2), y[1:]), [x, y]) == [
        "output 0 shares memory with input 0",
        "output 2 shares memory with input 1",
    ]
    assert _aliases(x.clone(), [x]) == []


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
