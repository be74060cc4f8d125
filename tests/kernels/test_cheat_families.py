"""The four families of cheats that defeated checks run inside the candidate's own process, each
as a class: whatever the candidate's process does, the reward scores the program it describes,
replayed by a trusted runner on inputs it never saw, and the launch rules are judged on values.

1. compute that runs after the check: lazy containers and tensor subclasses as outputs;
2. compute the recorder never sees: lookup tables built from the seeds it could guess, values read
   into Python (formatting, .tolist(), int() inside a kernel), hooks Triton calls around a
   launch, precomputing a permutation-invariant op on its own inputs;
3. the check switched off: the audit hook and the recorder disabled, the record forged, processes
   started to tamper later, the replay's files written;
4. launch rules read from text: values spelled another way, work moved into helpers, terms that
   cancel.

Each cheat is written here from the family's description; the assertions are on the reward, and
that the candidate (not the harness) was charged."""

from __future__ import annotations

import textwrap

import pytest
import torch

from stillroom.kernels import evaluate

from .test_validator import HEADER, RELU, candidate

# A copy kernel: whatever tensor the forward hands it becomes the output. The cheats below make
# that tensor hold the answer by other means.
COPY = """

@triton.jit
def copy_kernel(src_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def copy(src):
    out = torch.empty_like(src)
    copy_kernel[(triton.cdiv(src.numel(), 1024),)](src, out, src.numel(), BLOCK=1024)
    return out
"""

# Unhooks the extraction's audit hook (sandbox.guard): the closure of os.mkfifo's wrapper holds
# the cell of the hook's refuse(). What stays is below Python: the seccomp filter, the namespace.
UNHOOK = """
import os


def unhook():
    cells = dict(zip(os.mkfifo.__code__.co_freevars, os.mkfifo.__closure__))
    cells["refuse"].cell_contents = lambda *args: None


def attempt(fn):
    try:
        return "ok: " + repr(fn())[:100]
    except BaseException as exc:
        return type(exc).__name__ + ": " + str(exc)[:100]
"""


def cheat(forward: str, prelude: str = "", init: str = "") -> str:
    return candidate(forward, prelude=COPY + textwrap.dedent(prelude), init=init)


FAMILIES = {
    # 1. compute that runs after the check
    "a list subclass computes when iterated": cheat(
        "launch(x, torch.empty_like(x))\nreturn Lazy([x])",
        prelude="""
        class Lazy(list):
            def __iter__(self):
                return iter([torch.relu(t) for t in list.__iter__(self)])
        """,
    ),
    "a tuple subclass computes when indexed": cheat(
        "launch(x, torch.empty_like(x))\nreturn Lazy((x,))",
        prelude="""
        class Lazy(tuple):
            def __getitem__(self, i):
                return torch.relu(tuple.__getitem__(self, i))

            def __iter__(self):
                return iter([self[0]])
        """,
    ),
    "a tensor subclass answers every op with the answer": cheat(
        "out = torch.empty_like(x)\nlaunch(x, torch.empty_like(x))\nreturn Lazy.make(out, x)",
        prelude="""
        class Lazy(torch.Tensor):
            @staticmethod
            def make(out, x):
                t = out.as_subclass(Lazy)
                t.source = x
                return t


        def _answer(cls, func, types, args=(), kwargs=None):
            with torch._C.DisableTorchFunctionSubclass():
                source = next(a.source for a in args if isinstance(a, Lazy))
                return func(*[torch.relu(source) if isinstance(a, Lazy) else a for a in args],
                            **(kwargs or {}))


        Lazy.__torch_function__ = classmethod(_answer)
        """,
    ),
    # 2. compute the recorder never sees
    "a lookup table of the seeded draws, built in __init__": cheat(
        """
        key = round(float(x.flatten()[0]), 6)
        return copy(self.table.get(key, torch.zeros_like(x)))
        """,
        init="""
        self.table = {}
        for seed in range(64):
            for trial in range(8):
                torch.manual_seed(seed + 1 + trial)
                draw = torch.randn(16, 256)
                self.table[round(float(draw.flatten()[0]), 6)] = torch.relu(draw)
        """,
    ),
    "values read into Python by formatting": cheat(
        """
        values = [max(float(f"{v}"), 0.0) for v in x.flatten()]
        return copy(torch.tensor(values, dtype=x.dtype).view_as(x))
        """,
    ),
    "values read into Python by tolist": cheat(
        "return copy(torch.tensor([[max(v, 0.0) for v in row] for row in x.tolist()]))"
    ),
    "a hook Triton calls around a launch": cheat(
        """
        def hook(*args, **kwargs):
            self.out.copy_(torch.relu(x))

        self.out = torch.zeros_like(x)
        triton.knobs.runtime.launch_enter_hook = hook
        copy_kernel.add_pre_run_hook(hook)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](self.out, self.out, x.numel(), BLOCK=1024)
        return self.out
        """,
    ),
    "a kernel reads a value into Python": candidate(
        """
        out = torch.empty_like(x)
        branchy_kernel[(x.numel(),)](x, out)
        return out
        """,
        prelude="""

        @triton.jit
        def branchy_kernel(x_ptr, out_ptr):
            i = tl.program_id(0)
            v = tl.load(x_ptr + i)
            if float(v) > 0:
                tl.store(out_ptr + i, v)
            else:
                tl.store(out_ptr + i, v * 0.0)
        """,
    ),
    # 3. the check switched off
    "the audit hook and the recorder switched off, torch writes the output": cheat(
        """
        unhook()
        import importlib
        recorder = importlib.import_module("stillroom.kernels.extract")._recorder
        saved = list(recorder)
        recorder.clear()
        out = torch.empty_like(x)
        launch(x, torch.empty_like(x))
        out.copy_(torch.relu(x))
        recorder.extend(saved)
        return copy(out)
        """,
        prelude=UNHOOK,
    ),
    "a process started to rewrite the outputs later": cheat(
        """
        unhook()
        got = [attempt(os.fork), attempt(lambda: os.posix_spawn("/bin/sh", ["sh"], {}))]
        import ctypes
        got.append(attempt(lambda: ctypes.CDLL(None).fork()))
        if any(g.startswith("ok: 0") for g in got):
            os._exit(0)
        raise RuntimeError("REPORT " + repr(got))
        """,
        prelude=UNHOOK,
    ),
    "the replay's files written from the extraction": cheat(
        """
        unhook()
        here = os.getcwd()
        targets = [os.path.join(here, "..", "replay", "channel.bin"),
                   os.path.join(here, "..", "replay", "result.bin"),
                   os.path.join(os.path.dirname(here), "channel.bin")]
        got = [attempt(lambda t=t: open(t, "r+b").write(b"x" * 64)) for t in targets]
        got.append(attempt(lambda: os.listdir(os.path.dirname(here))))
        raise RuntimeError("REPORT " + repr(got))
        """,
        prelude=UNHOOK,
    ),
    # 4. launch rules read from text
    "a block size spelled tl.constexpr(4096)": HEADER.replace(
        "BLOCK=1024)", "BLOCK=tl.constexpr(4096))"
    ).replace("1024),)", "4096),)")
    + "\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        out = torch.empty_like(x)"
    "\n        launch(x, out)\n        return out\n",
    "a block of HALF + HALF": candidate(
        """
        out = torch.empty_like(x)
        halves_kernel[(triton.cdiv(x.numel(), 4096),)](x, out, x.numel(), HALF=2048)
        return out
        """,
        prelude="""

        @triton.jit
        def halves_kernel(x_ptr, out_ptr, n, HALF: tl.constexpr):
            offs = tl.program_id(0) * (HALF + HALF) + tl.arange(0, HALF + HALF)
            mask = offs < n
            tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)
        """,
    ),
    "a block size a heuristic makes": candidate(
        """
        out = torch.empty_like(x)
        wide_kernel[lambda meta: (triton.cdiv(x.numel(), meta["B"]),)](x, out, x.numel())
        return out
        """,
        prelude="""

        @triton.heuristics({"B": lambda args: 4096})
        @triton.jit
        def wide_kernel(x_ptr, out_ptr, n, B: tl.constexpr):
            offs = tl.program_id(0) * B + tl.arange(0, B)
            mask = offs < n
            tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)
        """,
    ),
    "a 1000-step static_range moved into a helper": candidate(
        """
        out = torch.empty_like(x)
        deep_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
        """,
        prelude="""

        @triton.jit
        def spin(v):
            for i in tl.static_range(1000):
                v = tl.maximum(v * 1.0 + 0.0, v)
            return v


        @triton.jit
        def deep_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            x = spin(tl.load(x_ptr + offs, mask=mask))
            tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)
        """,
    ),
    "a strided-only load moved into a helper": candidate(
        """
        out = torch.empty_like(x)
        block = triton.next_power_of_2(triton.cdiv(x.numel(), 16))  # correct on every shape
        strided_kernel[(16,)](x, out, x.numel(), 16, BLOCK=block)
        return out
        """,
        prelude="""

        @triton.jit
        def gather(ptr, offs, mask):
            return tl.load(ptr + offs, mask=mask)


        @triton.jit
        def strided_kernel(x_ptr, out_ptr, n, programs, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK) * programs + tl.program_id(0)
            mask = offs < n
            tl.store(out_ptr + offs, tl.maximum(gather(x_ptr, offs, mask), 0.0), mask=mask)
        """,
    ),
    "terms that cancel make a strided access look coalesced": candidate(
        """
        out = torch.empty_like(x)
        block = triton.next_power_of_2(triton.cdiv(x.numel(), 16))  # correct on every shape
        column_kernel[(16,)](x, out, x.numel(), 16, BLOCK=block)
        return out
        """,
        prelude="""

        @triton.jit
        def column_kernel(x_ptr, out_ptr, n, programs, BLOCK: tl.constexpr):
            lanes = tl.arange(0, BLOCK)
            offs = lanes * programs + tl.program_id(0) + lanes - lanes
            mask = offs < n
            tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)
        """,
    ),
}

# what the reasons must say for each, to show the cheat was seen for what it is
WHY = {
    "a list subclass computes when iterated": "the forward returned a Lazy",
    "a tuple subclass computes when indexed": "the forward returned a Lazy",
    "a tensor subclass answers every op with the answer": "trial 0: output 0",
    "a lookup table of the seeded draws, built in __init__": "trial 0: output 0",
    "values read into Python by formatting": "trial 0: output 0",
    "values read into Python by tolist": "trial 0: output 0",
    "a hook Triton calls around a launch": "trial 0: output 0",
    "a kernel reads a value into Python": "float() of a Triton tensor",
    "the audit hook and the recorder switched off, torch writes the output": "trial 0: output 0",
    "a process started to rewrite the outputs later": "REPORT",
    "the replay's files written from the extraction": "REPORT",
    "a block size spelled tl.constexpr(4096)": "block size BLOCK=4096 exceeds 2048",
    "a block of HALF + HALF": "a block of 4096 elements (tl.arange or a block shape) exceeds 2048",
    "a block size a heuristic makes": "a block of 4096 elements (tl.arange or a block shape)",
    "a 1000-step static_range moved into a helper": "instructions per program",
    "a strided-only load moved into a helper": "tl.load has no unit-stride axis",
    "terms that cancel make a strided access look coalesced": "tl.load has no unit-stride axis",
}


# correct on every case: only a rule judged on values refuses them
CORRECT = {
    "a block size spelled tl.constexpr(4096)",
    "a block of HALF + HALF",
    "a block size a heuristic makes",
    "a 1000-step static_range moved into a helper",
    "a strided-only load moved into a helper",
    "terms that cancel make a strided access look coalesced",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_cheat_of_the_four_families_earns_0(name):
    r = evaluate(RELU, FAMILIES[name], timeout_s=30)
    assert r.reward == 0 and r.status == "scored", (name, r)
    assert any(WHY[name] in why for why in r.reasons), (name, r.reasons)
    assert (r.exec_reward == 1) == (name in CORRECT), (name, r.reasons)


def test_the_lookup_table_would_have_matched_inputs_drawn_from_the_configured_seed():
    """The table cheat is real: it holds the answer for every input drawn as trial t of seed s,
    which is how a validator seeding its inputs from the config would draw them."""
    torch.manual_seed(0 + 1 + 0)
    draw = torch.randn(16, 256)
    init = FAMILIES["a lookup table of the seeded draws, built in __init__"]
    assert "torch.manual_seed(seed + 1 + trial)" in init and "torch.randn(16, 256)" in init
    assert torch.equal(torch.relu(draw), draw.clamp(min=0))


def test_rules_on_values_pass_what_a_text_rule_refused_and_refuse_what_it_passed():
    """An honest kernel whose block is written HALF + HALF at 2 x 512 keeps the rules: values, not
    spelling, decide."""
    small = (
        FAMILIES["a block of HALF + HALF"]
        .replace("4096),)", "1024),)")
        .replace("HALF=2048", "HALF=512")
    )
    assert evaluate(RELU, small, trials=1).reward == 1


def test_forged_records_describe_other_programs_and_earn_what_those_earn():
    """The record is the candidate's to write (it may overwrite the extraction's). A forged one is
    checked as data and replayed: a program returning its input, or a constant holding the answer
    for the extraction's inputs, earns 0; a module alias claimed to be triton.language only binds
    that name to triton.language in the replay."""
    forge = UNHOOK + textwrap.dedent("""
        import json, mmap, struct


        def forge(record):
            unhook()
            fd = os.open("out.bin", os.O_RDWR)
            m = mmap.mmap(fd, 0)
            data = json.dumps(record).encode()
            m[16 : 16 + len(data)] = data
            m[:16] = struct.pack("<8sQ", b"SRPROG01", len(data))
            m.flush()
            os._exit(0)
        """)
    alias = {
        "storages": [{"kind": "input", "index": 0, "nbytes": 16384}],
        "steps": [],
        "returns": {
            "tensor": {"storage": 0, "dtype": "float32", "offset": 0, "shape": [16, 256],
                       "stride": [256, 1]}
        },
    }  # fmt: skip
    for junk in ([1, 2], "a string", 3):  # not an object at all: the candidate's failure
        r = evaluate(RELU, candidate(f"forge({junk!r})", prelude=forge), cases=[])
        assert r.reward == 0 and r.status == "scored", r
        assert "without a readable record (the record is not an object)" in r.reasons[0], r
    record = {"programs": [alias], "again": [alias], "kernels": {}}
    source = candidate(f"forge({record!r})", prelude=forge)
    r = evaluate(RELU, source, cases=[])
    assert r.reward == 0 and "output 0 shares memory with input 0" in r.reasons, r.reasons
    assert "no Triton kernel was launched" in r.reasons

    numpy_as_language = {
        "0:k": {
            "name": "k",
            "source": "def k(x_ptr, out_ptr, n, BLOCK: np.constexpr):\n"
            "    offs = np.program_id(0) * BLOCK + np.arange(0, BLOCK)\n"
            "    np.store(out_ptr + offs, np.maximum(np.load(x_ptr + offs, mask=offs < n), 0.0),"
            " mask=offs < n)\n",
            "globals": {"np": {"module": "triton.language"}},
        }
    }
    out_view = {
        "storage": 1,
        "dtype": "float32",
        "offset": 0,
        "shape": [16, 256],
        "stride": [256, 1],
    }
    honest = {
        "storages": [
            {"kind": "input", "index": 0, "nbytes": 16384},
            {"kind": "alloc", "nbytes": 16384, "dtype": "float32", "fill": None},
        ],
        "steps": [
            {
                "op": "launch",
                "alternatives": [
                    {
                        "kernel": "0:k",
                        "grid": [4],
                        "args": {
                            "x_ptr": {"tensor": {**out_view, "storage": 0}},
                            "out_ptr": {"tensor": out_view},
                            "n": {"value": 4096},
                            "BLOCK": {"value": 1024},
                        },
                    }
                ],
            }
        ],
        "returns": {"tensor": out_view},
    }
    forged = {"programs": [honest], "again": [honest], "kernels": numpy_as_language}
    source = candidate(f"forge({forged!r})", prelude=forge)
    r = evaluate(RELU, source, cases=[])
    # a program of triton.language only, whatever its names: a Triton implementation exists
    assert r.reward == 1, r.reasons
