"""Round four of cheats (issue 41, item 3): what a policy under RL would find against the
replayed-program reward, by class, each case written from the class's description. Every one must
earn 0, scored (charged to the candidate, never the harness), with a reason that names it.

- HOST_MADE: host steps (copies, fills, allocations) make an output, a launch does nothing useful;
- TABLES: a table torch computed from no input (an interpolation table, a table over every bit
  pattern of a 16-bit dtype) read by the kernel;
- SAMPLED: a launch rule broken where the old measurement did not look (a middle program
  instance, a later iteration of a run-time loop, a second launch of the same kernel and
  constexprs, a case other than the first) or in a way it did not measure (a block built by
  reshape, join or broadcast; an access site shared with a scalar or a coalesced call; a strided
  access hidden by a broadcast axis);
- AUTOTUNE: a config other than the first computes something else;
- RACES: program instances that depend on running in order, or update memory without atomics;
- CACHED: a module whose later calls differ from its first;
- UNCOMPILABLE: kernel sources that parse but do not compile, or nest too deep (recorded through a
  forged line cache, as inspect.getsource reads it).
"""

from __future__ import annotations

import textwrap

import pytest

from stillroom.kernels import evaluate

from .test_validator import RELU

IMPORTS = (
    "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\nimport triton\n"
    "import triton.language as tl\n"
)


def problem(forward: str, inputs: str, doc: str) -> str:
    """A KernelBench-style problem whose forward returns ``forward`` of x (and y)."""
    return (
        f'"""{doc}"""\n{IMPORTS}\n\nclass Model(nn.Module):\n'
        f"    def forward(self, *args):\n        x, *rest = args\n        y = rest[0] if rest "
        f"else None\n        return {forward}\n\n\ndef get_inputs():\n    return {inputs}\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )


TRANSPOSE = problem("x.t()", "[torch.randn(48, 80)]", "Transpose a matrix.")
CONCAT = problem("torch.cat([x, y], dim=1)", "[torch.randn(32, 64), torch.randn(32, 64)]", "Cat.")
ZERO = problem("x * 0.0", "[torch.randn(16, 256)]", "Multiply by zero.")
PERMUTE = problem("x.permute(2, 0, 1)", "[torch.randn(8, 16, 32)]", "Permute three axes.")
IDENTITY = problem("x.clone()", "[torch.randn(16, 256)]", "The identity.")
TWOS = problem("x * 0.0 + 2.0", "[torch.randn(16, 256)]", "A constant of x's shape.")
FLAT_T = problem("x.t().reshape(-1)", "[torch.randn(48, 80)]", "Flatten the transpose.")
GELU = problem("F.gelu(x)", "[torch.randn(16, 256)]", "Exact GELU.")
SOFTPLUS = problem("F.softplus(x)", "[torch.randn(16, 256)]", "Softplus.")
SIGMOID16 = problem(
    "torch.sigmoid(x)", "[torch.randn(16, 256).half()]", "Sigmoid of a float16 tensor."
)
ROW_SUM = problem("x.sum(dim=1)", "[torch.randn(16, 512)]", "Row sums.")
TOTAL = problem("x.sum()", "[torch.randn(16, 512)]", "The sum of every element.")
CUMSUM = problem("torch.cumsum(x, dim=1)", "[torch.randn(16, 100)]", "Row prefix sums.")


def module(kernels: str, forward: str, init: str = "", prelude: str = "") -> str:
    """A candidate: its kernels, and a ModelNew whose forward body is ``forward`` (of x, y)."""
    body = textwrap.indent(textwrap.dedent(forward).strip(), " " * 8)
    init_body = textwrap.indent(textwrap.dedent(init).strip(), " " * 8) if init else ""
    return (
        IMPORTS
        + textwrap.dedent(prelude)
        + "\n\n"
        + textwrap.dedent(kernels).strip()
        + "\n\n\nclass ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        + (init_body + "\n" if init_body else "")
        + "\n    def forward(self, x, y=None):\n"
        + body
        + "\n"
    )


# A launch that reads an input and writes nothing: "a kernel ran".
NOOP = """
@triton.jit
def noop_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.load(x_ptr + offs, mask=offs < n)


def noop(x):
    noop_kernel[(triton.cdiv(x.numel(), 1024),)](x, x.numel(), BLOCK=1024)
"""

COPY = """
@triton.jit
def copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)
"""

HOST_MADE = {
    "a transpose made by .contiguous()": (
        TRANSPOSE,
        module(NOOP, "noop(x)\nreturn x.t().contiguous()"),
    ),
    "a concat made by copy_ into slices": (
        CONCAT,
        module(
            NOOP,
            """
            out = torch.empty(x.shape[0], x.shape[1] + y.shape[1])
            out[:, : x.shape[1]].copy_(x)
            out[:, x.shape[1] :].copy_(y)
            noop(x)
            return out
            """,
        ),
    ),
    "a zero op made by zeros_like": (ZERO, module(NOOP, "noop(x)\nreturn torch.zeros_like(x)")),
    "a permute made by .contiguous()": (
        PERMUTE,
        module(NOOP, "noop(x)\nreturn x.permute(2, 0, 1).contiguous()"),
    ),
    "an identity made by clone": (IDENTITY, module(NOOP, "noop(x)\nreturn x.clone()")),
    "a constant made by full_like": (TWOS, module(NOOP, "noop(x)\nreturn torch.full_like(x, 2.0)")),
    "half a concat by a kernel, half by copy_": (
        CONCAT,
        module(
            COPY,
            """
            out = torch.empty(x.shape[0], x.shape[1] + y.shape[1])
            left = torch.empty_like(x)
            copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, left, x.numel(), BLOCK=1024)
            out[:, : x.shape[1]].copy_(left)
            out[:, x.shape[1] :].copy_(y)
            return out
            """,
        ),
    ),
    "a kernel writes the output, copy_ overwrites it with the transpose": (
        TRANSPOSE,
        module(
            COPY,
            """
            out = torch.empty(x.shape[1], x.shape[0])
            copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
            out.copy_(x.t())
            return out
            """,
        ),
    ),
    "a flattened transpose made by reshape": (
        FLAT_T,
        module(NOOP, "noop(x)\nreturn x.t().reshape(-1)"),
    ),
    "a zero op made by zero_ after the launch": (
        ZERO,
        module(NOOP, "out = torch.empty_like(x)\nnoop(x)\nout.zero_()\nreturn out"),
    ),
}

# Linear interpolation in a table of 2048 knots on [-8, 8], loaded whole (coalesced) and gathered
# from registers; beyond the knots GELU and softplus are x or 0.
INTERPOLATE = """
@triton.jit
def lut_kernel(x_ptr, table_ptr, out_ptr, n, BLOCK: tl.constexpr, KNOTS: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    table = tl.load(table_ptr + tl.arange(0, KNOTS))
    t = (tl.minimum(tl.maximum(x, -8.0), 8.0) + 8.0) * ((KNOTS - 1) / 16.0)
    i = tl.minimum(t.to(tl.int32), KNOTS - 2)
    f = t - i.to(tl.float32)
    lo = tl.gather(table, i, 0)
    hi = tl.gather(table, i + 1, 0)
    y = lo + (hi - lo) * f
    y = tl.where(x > 8.0, x, tl.where(x < -8.0, 0.0, y))
    tl.store(out_ptr + offs, y, mask=mask)


def interpolate(x, table):
    out = torch.empty_like(x)
    lut_kernel[(triton.cdiv(x.numel(), 1024),)](x, table, out, x.numel(), BLOCK=1024, KNOTS=2048)
    return out
"""

# Every float16 bit pattern's sigmoid, read in 32 coalesced chunks of 2048 (a run-time loop).
BITS = """
@triton.jit
def bits_kernel(x_ptr, table_ptr, out_ptr, n, BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    idx = tl.load(x_ptr + offs, mask=mask, other=0).to(tl.int32) + 32768
    y = tl.zeros((BLOCK,), dtype=tl.float16)
    for start in range(0, 65536, CHUNK):
        chunk = tl.load(table_ptr + start + tl.arange(0, CHUNK))
        inside = (idx >= start) & (idx < start + CHUNK)
        local = tl.where(inside, idx - start, 0)
        y = tl.where(inside, tl.gather(chunk, local, 0), y)
    tl.store(out_ptr + offs, y, mask=mask)
"""

FP16_TABLE = (
    "torch.sigmoid(torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)"
    ".view(torch.float16))"
)

TABLES = {
    "a GELU interpolation table built in forward": (
        GELU,
        module(INTERPOLATE, "return interpolate(x, F.gelu(torch.linspace(-8.0, 8.0, 2048)))"),
    ),
    "a softplus interpolation table built in forward": (
        SOFTPLUS,
        module(INTERPOLATE, "return interpolate(x, F.softplus(torch.linspace(-8.0, 8.0, 2048)))"),
    ),
    "a GELU table kept as an attribute from __init__": (
        GELU,
        module(
            INTERPOLATE,
            "return interpolate(x, self.table)",
            init="self.table = F.gelu(torch.linspace(-8.0, 8.0, 2048))",
        ),
    ),
    "a GELU table as a non-persistent buffer of ModelNew": (
        GELU,
        module(
            INTERPOLATE,
            "return interpolate(x, self.table)",
            init='self.register_buffer("table", F.gelu(torch.linspace(-8.0, 8.0, 2048)), '
            "persistent=False)",
        ),
    ),
    "a GELU table copied by the host into an allocation": (
        GELU,
        module(
            INTERPOLATE + NOOP,
            """
            table = F.gelu(torch.linspace(-8.0, 8.0, 2048))
            noop(table)  # the table becomes known to the program, so copy_ is recorded
            copied = torch.empty(2048)
            copied.copy_(table)
            return interpolate(x, copied)
            """,
        ),
    ),
    "a table over every float16 bit pattern": (
        SIGMOID16,
        module(
            BITS,
            f"""
            out = torch.empty_like(x)
            table = {FP16_TABLE}
            bits_kernel[(triton.cdiv(x.numel(), 1024),)](
                x.view(torch.int16), table, out, x.numel(), BLOCK=1024, CHUNK=2048
            )
            return out
            """,
        ),
    ),
}


def relu_with(body: str, launch: str = "", params: str = "") -> str:
    """A relu candidate whose kernel computes ``offs``/``mask`` then runs ``body`` (which must
    store relu of x at every offset), launched by ``launch`` (default: grid cdiv(n, 1024))."""
    kernel = (
        "@triton.jit\n"
        f"def relu_kernel(x_ptr, out_ptr, n{params}, BLOCK: tl.constexpr):\n"
        "    pid = tl.program_id(0)\n"
        "    lanes = tl.arange(0, BLOCK)\n"
        # the block's elements in the order of a (32, BLOCK // 32) transpose: neighbours far apart
        "    strided = (lanes % 32) * (BLOCK // 32) + lanes // 32\n"
        + textwrap.indent(textwrap.dedent(body).strip(), "    ")
        + "\n"
    )
    launch = launch or "relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)"
    return module(kernel + STRIDED_HELPERS, f"out = torch.empty_like(x)\n{launch}\nreturn out")


STRIDED_HELPERS = """

@triton.jit
def relu_at(x_ptr, out_ptr, offs, mask):
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


@triton.jit
def spin(v):
    for i in tl.static_range(1000):
        v = tl.maximum(v * 1.0 + 0.0, v)
    return v
"""

COALESCED = "relu_at(x_ptr, out_ptr, pid * BLOCK + lanes, pid * BLOCK + lanes < n)"
STRIDED = "relu_at(x_ptr, out_ptr, pid * BLOCK + strided, pid * BLOCK + strided < n)"
SPUN = """
offs = pid * BLOCK + lanes
v = spin(tl.load(x_ptr + offs, mask=offs < n))
tl.store(out_ptr + offs, tl.maximum(v, 0.0), mask=offs < n)
"""
TWICE = (
    "half = triton.cdiv(x.numel() // 2, 1024) * 1024\n"
    "relu_kernel[(half // 1024,)](x, out, x.numel(), 0, 0, BLOCK=1024)\n"
    "relu_kernel[(triton.cdiv(x.numel() - half, 1024),)](x, out, x.numel(), half, 1, BLOCK=1024)"
)
UNCOALESCED = "has no unit-stride axis"
TOO_MANY = "instructions per program"

SAMPLED = {
    "a middle program instance strided": relu_with(
        f"if pid == 1:\n    {STRIDED}\nelse:\n    {COALESCED}"
    ),
    "every middle instance strided on the line the first and last use": relu_with(
        """
        offs = pid * BLOCK + tl.where((pid > 0) & (pid < tl.num_programs(0) - 1), strided, lanes)
        relu_at(x_ptr, out_ptr, offs, offs < n)
        """,
        launch="relu_kernel[(triton.cdiv(x.numel(), 512),)](x, out, x.numel(), BLOCK=512)",
    ),
    "a middle instance unrolled 1000 times": relu_with(
        f"if pid == 2:\n{textwrap.indent(SPUN.strip(), '    ')}\nelse:\n    {COALESCED}"
    ),
    "a run-time loop's later iterations unrolled": relu_with(
        """
        for part in range(0, n_parts):
            offs = pid * BLOCK + part * (BLOCK // 4) + tl.arange(0, BLOCK // 4)
            v = tl.load(x_ptr + offs, mask=offs < n)
            if part > 0:
                v = spin(v)
            tl.store(out_ptr + offs, tl.maximum(v, 0.0), mask=offs < n)
        """,
        params=", n_parts",
        launch="relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), 4, BLOCK=1024)",
    ),
    "a run-time loop's last iteration strided on a coalesced line": relu_with(
        """
        for part in range(0, n_parts):
            inner = tl.arange(0, BLOCK // 16)
            inner_strided = (inner % 32) * (BLOCK // 512) + inner // 32
            offs = pid * BLOCK + part * (BLOCK // 16) + tl.where(part == 15, inner_strided, inner)
            relu_at(x_ptr, out_ptr, offs, offs < n)
        """,
        params=", n_parts",
        launch="relu_kernel[(triton.cdiv(x.numel(), 2048),)](x, out, x.numel(), 16, BLOCK=2048)",
    ),
    "a second launch of the same kernel and constexprs strided": relu_with(
        """
        if mode == 1:
            offs = start + pid * BLOCK + strided
        else:
            offs = start + pid * BLOCK + lanes
        relu_at(x_ptr, out_ptr, offs, offs < n)
        """,
        params=", start, mode",
        launch=TWICE,
    ),
    "a second launch of the same kernel and constexprs unrolled": relu_with(
        """
        offs = start + pid * BLOCK + lanes
        v = tl.load(x_ptr + offs, mask=offs < n)
        if mode == 1:
            v = spin(v)
        tl.store(out_ptr + offs, tl.maximum(v, 0.0), mask=offs < n)
        """,
        params=", start, mode",
        launch=TWICE,
    ),
    "strided only on large values (a case after the first)": relu_with(
        f"""
        probe = tl.load(x_ptr + pid * BLOCK + lanes, mask=pid * BLOCK + lanes < n, other=0.0)
        if tl.max(tl.abs(probe), axis=0) > 100.0:
            {STRIDED}
        else:
            {COALESCED}
        """
    ),
    "strided only on zeros (a case after the first)": relu_with(
        f"""
        probe = tl.load(x_ptr + pid * BLOCK + lanes, mask=pid * BLOCK + lanes < n, other=0.0)
        if tl.max(tl.abs(probe), axis=0) == 0.0:
            {STRIDED}
        else:
            {COALESCED}
        """
    ),
    "unrolled only on large values": relu_with(
        """
        offs = pid * BLOCK + lanes
        v = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        if tl.max(tl.abs(v), axis=0) > 100.0:
            v = spin(v)
        tl.store(out_ptr + offs, tl.maximum(v, 0.0), mask=offs < n)
        """
    ),
    "a block of 4096 made by tl.reshape": relu_with(
        """
        offs = pid * 4096 + tl.reshape(tl.arange(0, 1024)[:, None] * 4 + tl.arange(0, 4)[None, :],
                                       (4096,))
        relu_at(x_ptr, out_ptr, offs, offs < n)
        """,
        launch="relu_kernel[(triton.cdiv(x.numel(), 4096),)](x, out, x.numel(), BLOCK=1024)",
    ),
    "a block of 4096 made by tl.join": relu_with(
        """
        half = tl.arange(0, 2048)
        offs = pid * 4096 + tl.reshape(tl.join(half * 2, half * 2 + 1), (4096,))
        relu_at(x_ptr, out_ptr, offs, offs < n)
        """,
        launch="relu_kernel[(triton.cdiv(x.numel(), 4096),)](x, out, x.numel(), BLOCK=1024)",
    ),
    "a block of 4096 made by broadcast_to": relu_with(
        """
        rows = tl.broadcast_to(tl.arange(0, 2048)[:, None] * 2, (2048, 2))
        offs = pid * 4096 + tl.reshape(rows + tl.arange(0, 2)[None, :], (4096,))
        relu_at(x_ptr, out_ptr, offs, offs < n)
        """,
        launch="relu_kernel[(triton.cdiv(x.numel(), 4096),)](x, out, x.numel(), BLOCK=1024)",
    ),
    "a block of 4096 made by tl.full": relu_with(
        """
        offs = pid * 4096 + tl.cumsum(tl.full((4096,), 1, tl.int32), 0) - 1
        relu_at(x_ptr, out_ptr, offs, offs < n)
        """,
        launch="relu_kernel[(triton.cdiv(x.numel(), 4096),)](x, out, x.numel(), BLOCK=1024)",
    ),
    "a strided helper line also called once on a scalar": relu_with(
        f"""
        relu_at(x_ptr, out_ptr, pid * BLOCK, pid * BLOCK < n)
        {STRIDED}
        """
    ),
    "a strided helper line also called on a large coalesced block": relu_with(
        """
        base = pid * 2048
        small = tl.arange(0, 128)
        small_strided = (small % 32) * 4 + small // 32
        relu_at(x_ptr, out_ptr, base + small_strided, base + small_strided < n)
        relu_at(x_ptr, out_ptr, base + 128 + lanes, base + 128 + lanes < n)
        rest = base + 1152 + tl.arange(0, 512)
        relu_at(x_ptr, out_ptr, rest, rest < n)
        rest = base + 1664 + tl.arange(0, 256)
        relu_at(x_ptr, out_ptr, rest, rest < n)
        rest = base + 1920 + tl.arange(0, 128)
        relu_at(x_ptr, out_ptr, rest, rest < n)
        """,
        launch="relu_kernel[(triton.cdiv(x.numel(), 2048),)](x, out, x.numel(), BLOCK=1024)",
    ),
    "a strided access hidden by a broadcast axis of 32": relu_with(
        """
        offs = pid * BLOCK + strided
        wide = offs[None, :] + tl.zeros((32, 1), dtype=tl.int32)
        v = tl.max(tl.load(x_ptr + wide, mask=wide < n, other=0.0), axis=0)
        tl.store(out_ptr + offs, tl.maximum(v, 0.0), mask=offs < n)
        """,
        launch="relu_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)",
    ),
}

SAMPLED_WHY = {
    "a middle instance unrolled 1000 times": TOO_MANY,
    "a run-time loop's later iterations unrolled": TOO_MANY,
    "a second launch of the same kernel and constexprs unrolled": TOO_MANY,
    "unrolled only on large values": TOO_MANY,
    "a block of 4096 made by tl.reshape": "a block of 4096 elements",
    "a block of 4096 made by tl.join": "a block of 4096 elements",
    "a block of 4096 made by broadcast_to": "a block of 4096 elements",
    "a block of 4096 made by tl.full": "a block of 4096 elements",
}


def tuned(configs: str, body: str) -> str:
    """An autotuned relu whose later configs (constexpr FAST=1) run ``body``."""
    return module(
        f"""
        @triton.autotune(configs=[{configs}], key=["n"])
        @triton.jit
        def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, FAST: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(x_ptr + offs, mask=mask)
            if FAST:
{textwrap.indent(textwrap.dedent(body).strip(), " " * 16)}
            else:
                tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)
        """,
        "out = torch.empty_like(x)\n"
        "relu_kernel[lambda meta: (triton.cdiv(x.numel(), meta['BLOCK']),)](x, out, x.numel())\n"
        "return out",
    )


TWO_CONFIGS = 'triton.Config({"BLOCK": 256, "FAST": 0}), triton.Config({"BLOCK": 256, "FAST": 1})'
AUTOTUNE = {
    "a later config returns x itself": tuned(TWO_CONFIGS, "tl.store(out_ptr + offs, x, mask=mask)"),
    "a later config writes zeros": tuned(
        TWO_CONFIGS, "tl.store(out_ptr + offs, x * 0.0, mask=mask)"
    ),
    "a later config writes half of each block": tuned(
        TWO_CONFIGS,
        "tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask & (tl.arange(0, BLOCK) < 128))",
    ),
    "the last of three configs is wrong": tuned(
        'triton.Config({"BLOCK": 256, "FAST": 0}), triton.Config({"BLOCK": 512, "FAST": 0}), '
        'triton.Config({"BLOCK": 1024, "FAST": 1})',
        "tl.store(out_ptr + offs, tl.abs(x), mask=mask)",
    ),
    "a later config strided": tuned(
        TWO_CONFIGS,
        """
        lanes = tl.arange(0, BLOCK)
        s = tl.program_id(0) * BLOCK + (lanes % 32) * (BLOCK // 32) + lanes // 32
        tl.store(out_ptr + s, tl.maximum(tl.load(x_ptr + s, mask=s < n), 0.0), mask=s < n)
        """,
    ),
}
AUTOTUNE_WHY = {"a later config strided": UNCOALESCED}

RACE = "without atomics"
RACES = {
    "a split row sum read-modify-write without atomics": (
        ROW_SUM,
        module(
            """
            @triton.jit
            def split_sum(x_ptr, out_ptr, cols, BLOCK: tl.constexpr):
                row = tl.program_id(0)
                c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
                part = tl.sum(tl.load(x_ptr + row * cols + c, mask=c < cols, other=0.0), axis=0)
                tl.store(out_ptr + row, tl.load(out_ptr + row) + part)
            """,
            """
            out = torch.zeros(x.shape[0])
            split_sum[(x.shape[0], triton.cdiv(x.shape[1], 128))](x, out, x.shape[1], BLOCK=128)
            return out
            """,
        ),
    ),
    "a total split over programs without atomics": (
        TOTAL,
        module(
            """
            @triton.jit
            def split_total(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
                offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
                part = tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0)
                tl.store(out_ptr, tl.load(out_ptr) + part)
            """,
            """
            out = torch.zeros(())
            split_total[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
            return out
            """,
        ),
    ),
    "the last program sums the others' partials": (
        ROW_SUM,
        module(
            """
            @triton.jit
            def two_phase(x_ptr, part_ptr, out_ptr, cols, SPLITS: tl.constexpr,
                          BLOCK: tl.constexpr):
                row = tl.program_id(0)
                split = tl.program_id(1)
                c = split * BLOCK + tl.arange(0, BLOCK)
                part = tl.sum(tl.load(x_ptr + row * cols + c, mask=c < cols, other=0.0), axis=0)
                tl.store(part_ptr + row * SPLITS + split, part)
                if split == SPLITS - 1:
                    parts = tl.load(part_ptr + row * SPLITS + tl.arange(0, SPLITS))
                    tl.store(out_ptr + row, tl.sum(parts, axis=0))
            """,
            """
            splits = triton.next_power_of_2(triton.cdiv(x.shape[1], 128))
            parts = torch.zeros(x.shape[0], splits)
            out = torch.empty(x.shape[0])
            two_phase[(x.shape[0], splits)](x, parts, out, x.shape[1], SPLITS=splits, BLOCK=128)
            return out
            """,
        ),
    ),
    "a prefix sum carried from the previous program's output": (
        CUMSUM,
        module(
            """
            @triton.jit
            def carried(x_ptr, out_ptr, cols, BLOCK: tl.constexpr):
                row = tl.program_id(0)
                chunk = tl.program_id(1)
                c = chunk * BLOCK + tl.arange(0, BLOCK)
                v = tl.cumsum(tl.load(x_ptr + row * cols + c, mask=c < cols, other=0.0), axis=0)
                prev = tl.load(out_ptr + row * cols + chunk * BLOCK - 1, mask=chunk > 0, other=0.0)
                tl.store(out_ptr + row * cols + c, v + prev, mask=c < cols)
            """,
            """
            out = torch.empty_like(x)
            carried[(x.shape[0], triton.cdiv(x.shape[1], 32))](x, out, x.shape[1], BLOCK=32)
            return out
            """,
        ),
    ),
    "a prefix sum carried through a scratch buffer": (
        CUMSUM,
        module(
            """
            @triton.jit
            def carried(x_ptr, carry_ptr, out_ptr, cols, chunks, BLOCK: tl.constexpr):
                row = tl.program_id(0)
                chunk = tl.program_id(1)
                c = chunk * BLOCK + tl.arange(0, BLOCK)
                v = tl.load(x_ptr + row * cols + c, mask=c < cols, other=0.0)
                prev = tl.load(carry_ptr + row * chunks + chunk - 1, mask=chunk > 0, other=0.0)
                tl.store(carry_ptr + row * chunks + chunk, prev + tl.sum(v, axis=0))
                tl.store(out_ptr + row * cols + c, tl.cumsum(v, axis=0) + prev, mask=c < cols)
            """,
            """
            chunks = triton.cdiv(x.shape[1], 32)
            carry = torch.zeros(x.shape[0], chunks)
            out = torch.empty_like(x)
            carried[(x.shape[0], chunks)](x, carry, out, x.shape[1], chunks, BLOCK=32)
            return out
            """,
        ),
    ),
}

HONEST_RELU = module(
    COPY.replace(
        "tl.load(src_ptr + offs, mask=mask)", "tl.maximum(tl.load(src_ptr + offs, mask=mask), 0.0)"
    ),
    "out = torch.empty_like(x)\n"
    "copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)\nreturn out",
)
RELU_BODY = (
    "out = torch.empty_like(x)\n"
    "copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)"
)
RELU_KERNEL = (
    COPY.replace(
        "tl.load(src_ptr + offs, mask=mask)", "tl.maximum(tl.load(src_ptr + offs, mask=mask), 0.0)"
    )
    + NOOP
)
CHANGED = "a second call"
CACHED = {
    "a cache of the first call's output by shape": module(
        RELU_KERNEL,
        """
        key = tuple(x.shape)
        if key not in self.cache:
            out = torch.empty_like(x)
            copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
            self.cache[key] = out
        return self.cache[key]
        """,
        init="self.cache = {}",
    ),
    "later calls launch a do-nothing kernel and return the cache": module(
        RELU_KERNEL,
        """
        if self.out is not None and self.out.shape == x.shape:
            noop(x)
            return self.out
        self.out = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, self.out, x.numel(), BLOCK=1024)
        return self.out
        """,
        init="self.out = None",
    ),
    "later calls compute with torch": module(
        RELU_KERNEL,
        """
        self.calls += 1
        if self.calls > 1:
            noop(x)
            return torch.relu(x)
        out = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
        """,
        init="self.calls = 0",
    ),
    "later calls return the input": module(
        RELU_KERNEL,
        """
        self.calls += 1
        if self.calls > 1:
            noop(x)
            return x
        out = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
        """,
        init="self.calls = 0",
    ),
    "a module-level cache keyed by the element count": module(
        RELU_KERNEL,
        """
        if x.numel() not in CACHE:
            CACHE[x.numel()] = torch.empty_like(x)
            copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, CACHE[x.numel()], x.numel(),
                                                          BLOCK=1024)
        noop(x)
        return CACHE[x.numel()]
        """,
        prelude="CACHE = {}\n",
    ),
}

GOOD_KERNEL = (
    "@triton.jit\ndef relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n"
    "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
    "    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=offs < n), 0.0), "
    "mask=offs < n)\n"
)


def forged(bad: str) -> str:
    """An honest relu whose recorded source (inspect.getsource reads the line cache) is ``bad``:
    text that parses but Python will not compile, or nests too deep."""
    return module(
        "",
        "out = torch.empty_like(x)\n"
        "relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)\n"
        "return out",
        prelude=f"""
        import linecache

        GOOD = {GOOD_KERNEL!r}
        BAD = {bad!r}
        linecache.cache["<forged>"] = (len(GOOD), None, GOOD.splitlines(True), "<forged>")
        exec(compile(GOOD, "<forged>", "exec"))
        linecache.cache["<forged>"] = (len(BAD), None, BAD.splitlines(True), "<forged>")
        """,
    )


def body(text: str) -> str:
    """The good kernel with ``text`` as its body."""
    return GOOD_KERNEL.split("    offs")[0] + textwrap.indent(textwrap.dedent(text).strip(), "    ")


UNCOMPILABLE = {
    "break outside a loop": forged(body("break")),
    "continue outside a loop": forged(body("continue")),
    "a repeated keyword argument": forged(body("tl.store(out_ptr, 0.0, mask=None, mask=None)")),
    "a repeated parameter": forged(GOOD_KERNEL.replace("out_ptr, n,", "out_ptr, out_ptr,")),
    "an expression nested thousands deep": forged(body("y = x_ptr" + " + x_ptr" * 5000)),
    "a sum nested 300 deep": forged(body("y = x_ptr" + " + x_ptr" * 300)),
    "a unary minus nested 250 deep": forged(body("y = " + "-" * 250 + "n")),
}

CASES: dict[str, tuple[str, str, str]] = {}  # name -> (class, problem, candidate)
for _name, (_problem, _source) in HOST_MADE.items():
    CASES[_name] = ("host-made outputs", _problem, _source)
for _name, (_problem, _source) in TABLES.items():
    CASES[_name] = ("tables from no input", _problem, _source)
for _name, _source in SAMPLED.items():
    CASES[_name] = ("rules on a sample", RELU, _source)
for _name, _source in AUTOTUNE.items():
    CASES[_name] = ("autotune configs", RELU, _source)
for _name, (_problem, _source) in RACES.items():
    CASES[_name] = ("order-dependent races", _problem, _source)
for _name, _source in CACHED.items():
    CASES[_name] = ("later calls differ", RELU, _source)
for _name, _source in UNCOMPILABLE.items():
    CASES[_name] = ("sources that do not compile", RELU, _source)

# what the reasons must say, per class (SAMPLED_WHY and AUTOTUNE_WHY per case)
WHY = {
    "host-made outputs": "not written by a kernel",
    "tables from no input": "made outside the program",
    "rules on a sample": UNCOALESCED,
    "autotune configs": "config",
    "order-dependent races": RACE,
    "later calls differ": CHANGED,
    "sources that do not compile": "cannot be checked",
}


def why(name: str) -> str:
    return SAMPLED_WHY.get(name) or AUTOTUNE_WHY.get(name) or WHY[CASES[name][0]]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_every_cheat_of_round_four_earns_0_with_its_reason(name):
    _, problem_src, source = CASES[name]
    r = evaluate(problem_src, source, timeout_s=60)
    assert r.reward == 0 and r.status == "scored", (name, r)
    assert any(why(name) in reason for reason in r.reasons), (name, r.reasons)


def test_there_are_fifty_cases_over_seven_classes():
    assert len(CASES) >= 50 and len({c for c, _, _ in CASES.values()}) == 7


@pytest.mark.parametrize(
    ("problem_src", "source"),
    [
        (
            TRANSPOSE,
            module(
                COPY,
                "out = torch.empty(x.shape[1], x.shape[0])\n"
                "copy_kernel[(triton.cdiv(x.numel(), 1024),)](x.t().contiguous(), "
                "out, x.numel(), BLOCK=1024)\nreturn out",
            ),
        ),
        (RELU, module(RELU_KERNEL, RELU_BODY + "\nreturn out.t().contiguous().t()")),
    ],
    ids=["a kernel copies a host relayout of its input", "a host copy of a kernel's output"],
)
def test_host_copies_around_kernel_stores_are_allowed(problem_src, source):
    """A host step may copy an input into place before a kernel, or copy what a kernel wrote:
    every output byte still comes from a kernel store."""
    r = evaluate(problem_src, source, trials=1, cases=["zero"])
    assert r.reward == 1, r.reasons


def test_honest_relu_of_this_file_earns_1():
    assert evaluate(RELU, HONEST_RELU, trials=1, cases=["odd_shape"]).reward == 1


def _mutants(text: str, count: int, seed: int) -> list[str]:
    """``count`` copies of ``text``, each with a few characters deleted, inserted or doubled."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(count):
        chars = list(text)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(chars))
            edit = rng.choice(("delete", "insert", "double"))
            if edit == "delete":
                del chars[at]
            elif edit == "insert":
                chars.insert(at, rng.choice("()[]{}:,.=+*-\n\t '\"x0@#\\"))
            else:
                chars.insert(at, chars[at])
        out.append("".join(chars))
    return out


MALFORMED_KERNELS = [
    body("f = lambda v: v\ntl.store(out_ptr, f(0.0))"),
    body("def inner():\n    pass"),
    body("class C:\n    pass"),
    body("import os"),
    body("global n\nn = 1"),
    body("yield n"),
    body("del n"),
    body("with n:\n    pass"),
    body("try:\n    pass\nexcept Exception:\n    pass"),
    body("raise ValueError()"),
    body("match n:\n    case 1:\n        pass"),
    body("y = (z := n)"),
    body("y = f'{n}'"),
    body("a, *b = (n, n)"),
    body("y = 1" + "0" * 5000),
    body("y = 'a\\x00b'"),
    body("y = " + "[" * 90 + "n" + "]" * 90),
    body("nonlocal n"),
    "",
    "\x00",
    GOOD_KERNEL + "\n" + GOOD_KERNEL.replace("relu_kernel", "other"),
    "class relu_kernel:\n    pass\n",
    "@weird(1)\n" + GOOD_KERNEL.split("\n", 1)[1],
    GOOD_KERNEL.replace("    offs", "\toffs"),
    GOOD_KERNEL + " " * 100_001,
    *_mutants(GOOD_KERNEL, 24, seed=41),
]
MALFORMED_MODULES = [
    "",
    "def broken(:\n",
    "class ModelNew:\n    pass\n",
    "ModelNew = 3\n",
    IMPORTS
    + "class ModelNew(nn.Module):\n    def forward(self, x):\n        return "
    + "(" * 300
    + "x"
    + ")" * 300
    + "\n",
    *_mutants(HONEST_RELU, 16, seed=42),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "source",
    [forged(k) for k in MALFORMED_KERNELS] + MALFORMED_MODULES,
    ids=[f"kernel-{i}" for i in range(len(MALFORMED_KERNELS))]
    + [f"module-{i}" for i in range(len(MALFORMED_MODULES))],
)
def test_no_malformed_source_makes_evaluate_raise_or_blame_the_harness(source):
    """Recorded kernel sources (through a forged line cache) and whole candidate modules, written
    wrong in many ways: each is scored, never raised out of evaluate() nor charged to the
    harness. A mutant that is still a right kernel may earn 1."""
    r = evaluate(RELU, source, trials=1, cases=[], timeout_s=60)
    assert r.status == "scored" and r.reasons, r
    assert (
        r.reward == 1
        or r.reward == 0
        and r.reasons != ["correct on every trial and case; Triton kernels did the work"]
    ), r
