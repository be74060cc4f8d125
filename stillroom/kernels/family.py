"""A generated family of easy kernel problems (``kind: kernels`` with ``family: elementwise``):
unary and binary elementwise ops over a few tensor shapes, each with a reference Triton solution
built from one template.

The family exists so that a tiny student can learn the kernel track in minutes: every solution is
the same masked, flat kernel with its arity and one expression changed, so SFT gets a student part
of the way and GRPO has rewards to learn from. A kernel is named after its op (``relu_kernel``), as
people name them: the answer's first choice (the name, in the plan) is then one lookup from the
prompt shared by every op, and the expression follows the name the student has just written
(measured: with one name for all, a tiny student learnt unary and binary ops as two separate
lookups, one of which often never formed). Every solution masks its last block and launches over
``numel()``, so it stays right for any shape and any value distribution the validator draws.
"""

from __future__ import annotations

# op -> (torch expression of the reference, Triton expression of the solution)
UNARY = {
    "relu": ("torch.relu(x)", "tl.maximum(x, 0.0)"),
    "neg": ("-x", "-x"),
    "abs": ("torch.abs(x)", "tl.abs(x)"),
    "square": ("x * x", "x * x"),
    "double": ("2.0 * x", "2.0 * x"),
    "add_one": ("x + 1.0", "x + 1.0"),
    "sigmoid": ("torch.sigmoid(x)", "tl.sigmoid(x)"),
    "relu6": ("torch.clamp(x, 0.0, 6.0)", "tl.minimum(tl.maximum(x, 0.0), 6.0)"),
}
BINARY = {
    "add": ("a + b", "a + b"),
    "sub": ("a - b", "a - b"),
    "mul": ("a * b", "a * b"),
    "maximum": ("torch.maximum(a, b)", "tl.maximum(a, b)"),
    "minimum": ("torch.minimum(a, b)", "tl.minimum(a, b)"),
}
# odd sizes among them: a solution without its mask fails those
SHAPES = ((16, 256), (7, 33), (1000,))
FAMILIES = ("elementwise",)

PROBLEM = '''\
"""Elementwise {op} of {what}, shape {shape}."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {args}):
        return {torch_expr}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
'''

SOLUTION = """\
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def {op}_kernel({ptrs}, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
{loads}
    y = {triton_expr}
    tl.store(out_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {args}):
{contiguous}
        out = torch.empty_like({first})
        n = {first}.numel()
        BLOCK = 1024
        {op}_kernel[(triton.cdiv(n, BLOCK),)]({args}, out, n, BLOCK=BLOCK)
        return out
"""


def _shape_name(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


def _parts(op: str) -> tuple[list[str], str, str]:
    if op in UNARY:
        return ["x"], *UNARY[op]
    return ["a", "b"], *BINARY[op]


def problem_names(family: str) -> list[str]:
    """Every problem of ``family``, ``<op>_<shape>`` (e.g. ``relu_7x33``), in a fixed order."""
    if family not in FAMILIES:
        raise ValueError(f"unknown kernel family '{family}' (have {', '.join(FAMILIES)})")
    return [f"{op}_{_shape_name(s)}" for op in (*UNARY, *BINARY) for s in SHAPES]


def _split(name: str) -> tuple[str, tuple[int, ...]]:
    op, _, shape = name.rpartition("_")
    dims = tuple(int(d) for d in shape.split("x")) if shape.replace("x", "").isdigit() else ()
    if (op not in UNARY and op not in BINARY) or dims not in SHAPES:
        raise ValueError(f"'{name}' is not a problem of the elementwise family")
    return op, dims


def problem_source(name: str) -> str:
    """The problem file of ``name``: a ``Model``, ``get_inputs`` and ``get_init_inputs``."""
    op, shape = _split(name)
    args, torch_expr, _ = _parts(op)
    dims = ", ".join(map(str, shape))
    return PROBLEM.format(
        op=op,
        what="one tensor" if len(args) == 1 else "two tensors",
        shape=shape,
        args=", ".join(args),
        torch_expr=torch_expr,
        inputs=", ".join(f"torch.randn({dims})" for _ in args),
    )


def solution_source(name: str) -> str:
    """The reference Triton solution of ``name``: one masked kernel over the flattened tensors."""
    op, _ = _split(name)
    args, _, triton_expr = _parts(op)
    return SOLUTION.format(
        op=op,
        ptrs=", ".join(f"{a}_ptr" for a in args),
        loads="\n".join(f"    {a} = tl.load({a}_ptr + offs, mask=mask)" for a in args),
        triton_expr=triton_expr,
        args=", ".join(args),
        contiguous="\n".join(f"        {a} = {a}.contiguous()" for a in args),
        first=args[0],
    )
