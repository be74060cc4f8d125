"""Kernels written in the style of the Triton that torch.compile (Inductor) generates, the style of
KernelBook / TritonTrace rows (AutoTriton's SFT data): ``triton_poi_fused_*`` (pointwise),
``triton_per_fused_*`` (persistent reductions, the block size a constexpr of the body) and
``triton_red_fused_*`` (looped reductions), xnumel/r0_numel, XBLOCK/R0_BLOCK, ``tmpN`` temporaries,
the runtime helpers ``triton_helpers`` (maximum, minimum, max2, welford_reduce, max_with_index),
``libdevice`` and ``tl_math`` imported from the installed torch (torch/_inductor/runtime/
triton_helpers.py), a ``call(args)`` wrapper and ``ModelNew.forward(input_0, ...)`` as KernelBook
rows hold them. Imitated: the code torch/_inductor/codegen/triton.py (torch 2.13) emits, and
KernelBook rows (huggingface.co/datasets/GPUMODE/KernelBook).

Inductor itself cannot emit this on a machine without a GPU: torch 2.13's codegen asks Triton for
the active driver's target (torch/utils/_triton.py triton_backend) and fails with "0 active
drivers" under ``cpu_backend="triton"``; so these are written, not generated."""

from __future__ import annotations

import textwrap

from . import Entry

HEADER = """\
import torch
import torch.nn as nn
import triton
import triton.language as tl
from torch._inductor.runtime import triton_helpers
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math

empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu
"""
ORIGIN = "torch/_inductor/codegen/triton.py output style (torch 2.13), KernelBook rows"


def _pointwise(op: str, body: str, n_inputs: int = 1, init: str = "", alloc: str = "") -> str:
    """A triton_poi_fused kernel over contiguous inputs of one shape, its call() and ModelNew."""
    ins = [f"in_ptr{i}" for i in range(n_inputs)]
    loads = "\n".join(f"tmp{i}_in = tl.load(in_ptr{i} + (x0), xmask)" for i in range(n_inputs))
    kernel = f"""
@triton.jit
def triton_poi_fused_{op}_0({", ".join(ins)}, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x0 = xindex
{textwrap.indent(loads, "    ")}
{textwrap.indent(textwrap.dedent(body).strip(), "    ")}
    tl.store(out_ptr0 + (x0), tmp_out, xmask)
"""
    args = [f"arg{i}_1" for i in range(n_inputs)]
    buf = alloc or (
        "buf0 = empty_strided_cpu(tuple(arg0_1.size()), tuple(arg0_1.stride()), arg0_1.dtype)"
    )
    call = f"""

def call(args):
    {", ".join(args)}, = args
    args.clear()
    {buf}
    xnumel = arg0_1.numel()
    triton_poi_fused_{op}_0[(triton.cdiv(xnumel, 256),)](
        {", ".join(args)}, buf0, xnumel, XBLOCK=256, num_warps=4, num_stages=1
    )
    return (buf0,)


class ModelNew(nn.Module):
{init or "    pass"}

    def forward(self, {", ".join(f"input_{i}" for i in range(n_inputs))}):
        output = call([{", ".join(f"input_{i}.contiguous()" for i in range(n_inputs))}])
        return output[0]
"""
    return HEADER + "\n" + kernel + call


POINTWISE = {
    # problem: (op name, body with tmp0_in.. -> tmp_out, inputs)
    "relu": (
        "relu",
        "tmp1 = tl.full([1], 0, tl.int32)\ntmp_out = triton_helpers.maximum(tmp1, tmp0_in)",
        1,
    ),
    "add": ("add", "tmp_out = tmp0_in + tmp1_in", 2),
    "mul": ("mul", "tmp_out = tmp0_in * tmp1_in", 2),
    "sigmoid": ("sigmoid", "tmp_out = tl.sigmoid(tmp0_in)", 1),
    "silu": ("silu", "tmp1 = tl.sigmoid(tmp0_in)\ntmp_out = tmp0_in * tmp1", 1),
    "swiglu": (
        "mul_silu",
        "tmp2 = tl.sigmoid(tmp0_in)\ntmp3 = tmp0_in * tmp2\ntmp_out = tmp3 * tmp1_in",
        2,
    ),
    "tanh": ("tanh", "tmp_out = libdevice.tanh(tmp0_in)", 1),
    "gelu_erf": (
        "gelu",
        """
        tmp1 = 0.5
        tmp2 = tmp0_in * tmp1
        tmp3 = 0.7071067811865476
        tmp4 = tmp0_in * tmp3
        tmp5 = libdevice.erf(tmp4)
        tmp6 = 1.0
        tmp7 = tmp5 + tmp6
        tmp_out = tmp2 * tmp7
        """,
        1,
    ),
    "gelu_tanh": (
        "gelu_tanh",
        """
        tmp1 = 0.5
        tmp2 = tmp0_in * tmp1
        tmp3 = tmp0_in * tmp0_in
        tmp4 = tmp3 * tmp0_in
        tmp5 = 0.044715
        tmp6 = tmp4 * tmp5
        tmp7 = tmp0_in + tmp6
        tmp8 = 0.7978845608028654
        tmp9 = tmp7 * tmp8
        tmp10 = libdevice.tanh(tmp9)
        tmp11 = 1.0
        tmp12 = tmp10 + tmp11
        tmp_out = tmp2 * tmp12
        """,
        1,
    ),
    "leaky_relu": (
        "leaky_relu",
        """
        tmp1 = 0.0
        tmp2 = tmp0_in > tmp1
        tmp3 = 0.1
        tmp4 = tmp0_in * tmp3
        tmp_out = tl.where(tmp2, tmp0_in, tmp4)
        """,
        1,
    ),
    "elu": (
        "elu",
        """
        tmp1 = 0.0
        tmp2 = tmp0_in > tmp1
        tmp3 = 1.0
        tmp4 = tmp0_in * tmp3
        tmp5 = libdevice.expm1(tmp4)
        tmp6 = tmp5 * tmp3
        tmp_out = tl.where(tmp2, tmp4, tmp6)
        """,
        1,
    ),
    "softplus": (
        "softplus",
        """
        tmp1 = 1.0
        tmp2 = tmp0_in * tmp1
        tmp3 = 20.0
        tmp4 = tmp2 > tmp3
        tmp5 = tl_math.exp(tmp2)
        tmp6 = libdevice.log1p(tmp5)
        tmp7 = tmp6 * tmp1
        tmp_out = tl.where(tmp4, tmp0_in, tmp7)
        """,
        1,
    ),
    "hardswish": (
        "hardswish",
        """
        tmp1 = 3.0
        tmp2 = tmp0_in + tmp1
        tmp3 = 0.0
        tmp4 = triton_helpers.maximum(tmp2, tmp3)
        tmp5 = 6.0
        tmp6 = triton_helpers.minimum(tmp4, tmp5)
        tmp7 = tmp0_in * tmp6
        tmp8 = 0.16666666666666666
        tmp_out = tmp7 * tmp8
        """,
        1,
    ),
    "clamp": (
        "clamp",
        """
        tmp1 = -0.5
        tmp2 = triton_helpers.maximum(tmp0_in, tmp1)
        tmp3 = 0.5
        tmp_out = triton_helpers.minimum(tmp2, tmp3)
        """,
        1,
    ),
    "scale_shift": (
        "add_mul",
        "tmp1 = 2.0\ntmp2 = tmp0_in * tmp1\ntmp3 = -0.5\ntmp_out = tmp2 + tmp3",
        1,
    ),
    "mish": (
        "mish",
        """
        tmp1 = 20.0
        tmp2 = tmp0_in > tmp1
        tmp3 = tl_math.exp(tmp0_in)
        tmp4 = libdevice.log1p(tmp3)
        tmp5 = tl.where(tmp2, tmp0_in, tmp4)
        tmp6 = libdevice.tanh(tmp5)
        tmp_out = tmp0_in * tmp6
        """,
        1,
    ),
}

POINTWISE["geglu"] = (
    "gelu_mul",
    """
    tmp2 = 0.5
    tmp3 = tmp0_in * tmp2
    tmp4 = 0.7071067811865476
    tmp5 = tmp0_in * tmp4
    tmp6 = libdevice.erf(tmp5)
    tmp7 = 1.0
    tmp8 = tmp6 + tmp7
    tmp9 = tmp3 * tmp8
    tmp_out = tmp9 * tmp1_in
    """,
    2,
)
POINTWISE["relu_squared"] = (
    "pow_relu",
    """
    tmp1 = tl.full([1], 0, tl.int32)
    tmp2 = triton_helpers.maximum(tmp1, tmp0_in)
    tmp_out = tmp2 * tmp2
    """,
    1,
)

INITS = {
    "clamp": "    def __init__(self, min_value, max_value):\n        super().__init__()",
    "leaky_relu": "    def __init__(self, negative_slope):\n        super().__init__()",
    "elu": "    def __init__(self, alpha):\n        super().__init__()",
    "scale_shift": "    def __init__(self, scale, shift):\n        super().__init__()",
}


def _reduction(kernel: str, launch: str, forward_args: str = "input_0", init: str = "") -> str:
    """A module of one reduction kernel, a call() that allocates and launches, and ModelNew."""
    return (
        HEADER
        + "\n"
        + textwrap.dedent(kernel)
        + "\n\ndef call(args):\n"
        + textwrap.indent(textwrap.dedent(launch).strip(), "    ")
        + "\n\n\nclass ModelNew(nn.Module):\n"
        + (init or "    pass")
        + f"\n\n    def forward(self, {forward_args}):\n"
        + f"        return call([{forward_args}])[0]\n"
    )


# a persistent row reduction: one row of r0_numel <= R0_BLOCK per x index, XBLOCK rows a program
PER_ROWS = """
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_index = tl.arange(0, R0_BLOCK)[None, :]
    r0_mask = r0_index < r0_numel
    x0 = xindex
    r1 = r0_index
"""


def _per(name: str, body: str, params: str = "in_ptr0, out_ptr0", rblock: int = 128) -> str:
    return (
        f"@triton.jit\ndef triton_per_fused_{name}_0({params}, xnumel, r0_numel, "
        "XBLOCK: tl.constexpr):\n"
        f"    R0_BLOCK: tl.constexpr = {rblock}\n"
        + textwrap.indent(textwrap.dedent(PER_ROWS).strip(), "    ")
        + "\n"
        + textwrap.indent(textwrap.dedent(body).strip(), "    ")
        + "\n"
    )


ROWS_LAUNCH = """
    (arg0_1,) = args
    args.clear()
    xnumel, r0_numel = arg0_1.shape
    buf0 = empty_strided_cpu({shape}, {stride}, torch.float32)
    {kernel}[(triton.cdiv(xnumel, 8),)](arg0_1, buf0, xnumel, r0_numel, XBLOCK=8, num_warps=2, num_stages=1)
    return ({ret},)
"""


def _rows(name: str, body: str, out: str = "rows", init: str = "") -> str:
    """A persistent reduction over each row of a 2-D input, out 'rows' (one value a row) or
    'same' (the input's shape)."""
    shape, stride, ret = (
        ("(xnumel,)", "(1,)", "buf0")
        if out == "rows"
        else ("(xnumel, r0_numel)", "(r0_numel, 1)", "buf0")
    )
    launch = ROWS_LAUNCH.format(
        shape=shape, stride=stride, ret=ret, kernel=f"triton_per_fused_{name}_0"
    )
    return _reduction(_per(name, body), launch, init=init)


SOFTMAX = """
tmp0 = tl.load(in_ptr0 + (r1 + r0_numel * x0), r0_mask & xmask, other=0.0)
tmp1 = tl.broadcast_to(tmp0, [XBLOCK, R0_BLOCK])
tmp3 = tl.where(r0_mask & xmask, tmp1, float("-inf"))
tmp4 = triton_helpers.max2(tmp3, 1)[:, None]
tmp5 = tmp0 - tmp4
tmp6 = tl_math.exp(tmp5)
tmp7 = tl.broadcast_to(tmp6, [XBLOCK, R0_BLOCK])
tmp9 = tl.where(r0_mask & xmask, tmp7, 0)
tmp10 = tl.sum(tmp9, 1)[:, None]
{tail}
tl.store(out_ptr0 + (r1 + r0_numel * x0), tmp11, r0_mask & xmask)
"""

REDUCTIONS = [
    (
        "softmax_rows",
        "_softmax",
        _rows("_softmax", SOFTMAX.format(tail="tmp11 = tmp6 / tmp10"), out="same"),
    ),
    (
        "log_softmax_rows",
        "_log_softmax",
        _rows("_log_softmax", SOFTMAX.format(tail="tmp11 = tmp5 - tl_math.log(tmp10)"), out="same"),
    ),
    (
        "logsumexp_rows",
        "logsumexp",
        _rows(
            "logsumexp",
            """
            tmp0 = tl.load(in_ptr0 + (r1 + r0_numel * x0), r0_mask & xmask, other=0.0)
            tmp1 = tl.broadcast_to(tmp0, [XBLOCK, R0_BLOCK])
            tmp3 = tl.where(r0_mask & xmask, tmp1, float("-inf"))
            tmp4 = triton_helpers.max2(tmp3, 1)[:, None]
            tmp5 = tl_math.abs(tmp4)
            tmp6 = float("inf")
            tmp7 = tmp5 == tmp6
            tmp8 = 0.0
            tmp9 = tl.where(tmp7, tmp8, tmp4)
            tmp10 = tmp0 - tmp9
            tmp11 = tl_math.exp(tmp10)
            tmp12 = tl.broadcast_to(tmp11, [XBLOCK, R0_BLOCK])
            tmp14 = tl.where(r0_mask & xmask, tmp12, 0)
            tmp15 = tl.sum(tmp14, 1)[:, None]
            tmp16 = tl_math.log(tmp15)
            tmp17 = tmp16 + tmp9
            tl.store(out_ptr0 + (x0), tmp17, xmask)
            """,
        ),
    ),
    (
        "mean_dim",
        "mean",
        _rows(
            "mean",
            """
            tmp0 = tl.load(in_ptr0 + (r1 + r0_numel * x0), r0_mask & xmask, other=0.0)
            tmp1 = tl.broadcast_to(tmp0, [XBLOCK, R0_BLOCK])
            tmp3 = tl.where(r0_mask & xmask, tmp1, 0)
            tmp4 = tl.sum(tmp3, 1)[:, None]
            tmp5 = r0_numel.to(tl.float32)
            tmp6 = tmp4 / tmp5
            tl.store(out_ptr0 + (x0), tmp6, xmask)
            """,
            init="    def __init__(self, dim):\n        super().__init__()",
        ),
    ),
    (
        "l2_normalize_rows",
        "div_linalg_vector_norm",
        _rows(
            "div_linalg_vector_norm",
            """
            tmp0 = tl.load(in_ptr0 + (r1 + r0_numel * x0), r0_mask & xmask, other=0.0)
            tmp1 = tmp0 * tmp0
            tmp2 = tl.broadcast_to(tmp1, [XBLOCK, R0_BLOCK])
            tmp4 = tl.where(r0_mask & xmask, tmp2, 0)
            tmp5 = tl.sum(tmp4, 1)[:, None]
            tmp6 = libdevice.sqrt(tmp5)
            tmp7 = 1e-12
            tmp8 = triton_helpers.maximum(tmp6, tmp7)
            tmp9 = tmp0 / tmp8
            tl.store(out_ptr0 + (r1 + r0_numel * x0), tmp9, r0_mask & xmask)
            """,
            out="same",
        ),
    ),
]

RED_SUM_DIM1 = """
@triton.jit
def triton_red_fused_sum_0(in_ptr0, out_ptr0, ks0, ks1, xnumel, r0_numel, XBLOCK: tl.constexpr, R0_BLOCK: tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    x0 = xindex % ks1
    x1 = xindex // ks1
    _tmp2 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    for r0_offset in range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        r2 = r0_index
        tmp0 = tl.load(in_ptr0 + (x0 + ks1 * r2 + ks0 * ks1 * x1), r0_mask & xmask, eviction_policy="evict_first", other=0.0)
        tmp1 = tl.broadcast_to(tmp0, [XBLOCK, R0_BLOCK])
        tmp3 = _tmp2 + tmp1
        _tmp2 = tl.where(r0_mask & xmask, tmp3, _tmp2)
    tmp2 = tl.sum(_tmp2, 1)[:, None]
    tl.store(out_ptr0 + (x0 + ks1 * x1), tmp2, xmask)
"""

RED_VAR = """
@triton.jit
def triton_red_fused_var_0(in_ptr0, out_ptr0, xnumel, r0_numel, XBLOCK: tl.constexpr, R0_BLOCK: tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    x0 = xindex
    tmp2_mean = tl.zeros([XBLOCK, R0_BLOCK], tl.float32)
    tmp2_m2 = tl.zeros([XBLOCK, R0_BLOCK], tl.float32)
    tmp2_weight = tl.zeros([XBLOCK, R0_BLOCK], tl.float32)
    for r0_offset in range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        r1 = r0_index
        tmp0 = tl.load(in_ptr0 + (r1 + r0_numel * x0), r0_mask & xmask, eviction_policy="evict_first", other=0.0)
        tmp1 = tl.broadcast_to(tmp0, [XBLOCK, R0_BLOCK])
        tmp2_mean_next, tmp2_m2_next, tmp2_weight_next = triton_helpers.welford_reduce(
            tmp1, tmp2_mean, tmp2_m2, tmp2_weight, r0_offset == 0
        )
        tmp2_mean = tl.where(r0_mask & xmask, tmp2_mean_next, tmp2_mean)
        tmp2_m2 = tl.where(r0_mask & xmask, tmp2_m2_next, tmp2_m2)
        tmp2_weight = tl.where(r0_mask & xmask, tmp2_weight_next, tmp2_weight)
    tmp2_tmp, tmp3_tmp, tmp4_tmp = triton_helpers.welford(tmp2_mean, tmp2_m2, tmp2_weight, 1)
    tmp3 = tmp3_tmp[:, None]
    tmp5 = (r0_numel - 1).to(tl.float32)
    tmp6 = tmp3 / tmp5
    tl.store(out_ptr0 + (x0), tmp6, xmask)
"""

RED_MSE = """
@triton.jit
def triton_red_fused_mse_loss_0(in_out_ptr0, in_ptr0, in_ptr1, xnumel, r0_numel, XBLOCK: tl.constexpr, R0_BLOCK: tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    _tmp4 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    for r0_offset in range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        r0 = r0_index
        tmp0 = tl.load(in_ptr0 + (r0), r0_mask, eviction_policy="evict_first", other=0.0)
        tmp1 = tl.load(in_ptr1 + (r0), r0_mask, eviction_policy="evict_first", other=0.0)
        tmp2 = tmp0 - tmp1
        tmp3 = tmp2 * tmp2
        tmp5 = _tmp4 + tl.broadcast_to(tmp3, [XBLOCK, R0_BLOCK])
        _tmp4 = tl.where(r0_mask, tmp5, _tmp4)
    tmp4 = tl.sum(_tmp4, 1)[:, None]
    tmp6 = r0_numel.to(tl.float32)
    tmp7 = tmp4 / tmp6
    tl.debug_barrier()
    tl.store(in_out_ptr0 + (tl.full([XBLOCK, 1], 0, tl.int32)), tmp7, None)
"""

SCAN = """
@triton.jit
def _triton_helper_fn_add0(arg0_0, arg1_0):
    tmp0 = arg0_0 + arg1_0
    return tmp0


@triton.jit
def triton_per_fused_cumsum_0(in_ptr0, out_ptr0, xnumel, r0_numel, XBLOCK: tl.constexpr):
    R0_BLOCK: tl.constexpr = 128
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_index = tl.arange(0, R0_BLOCK)[None, :]
    r0_mask = r0_index < r0_numel
    r1 = r0_index
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (r1 + r0_numel * x0), r0_mask & xmask, other=0.0)
    tmp1 = tmp0.to(tl.float32)
    tmp2 = tl.broadcast_to(tmp1, [XBLOCK, R0_BLOCK])
    tmp3, = tl.associative_scan((tmp2,), 1, _triton_helper_fn_add0)
    tl.store(out_ptr0 + (r1 + r0_numel * x0), tmp3, r0_mask & xmask)
"""

PER_MAX_DIM = _per(
    "max",
    """
    tmp0 = tl.load(in_ptr0 + (r1 + r0_numel * x0), r0_mask & xmask, other=0.0)
    tmp1 = tl.broadcast_to(tmp0, [XBLOCK, R0_BLOCK])
    tmp3 = tl.where(r0_mask & xmask, tmp1, float("-inf"))
    tmp4 = triton_helpers.max2(tmp3, 1)[:, None]
    tl.store(out_ptr0 + (x0), tmp4, xmask)
    """,
)

PER_ARGMAX = _per(
    "argmax",
    """
    tmp0 = tl.load(in_ptr0 + (x0 % ks0 + ks0 * r1 + ks0 * r0_numel * (x0 // ks0)), r0_mask & xmask, other=0.0)
    tmp1 = tl.broadcast_to(tmp0, [XBLOCK, R0_BLOCK])
    tmp3 = tl.where(r0_mask & xmask, tmp1, float("-inf"))
    tmp4 = tl.broadcast_to(r1, tmp3.shape)
    tmp2_val, tmp2_idx = triton_helpers.max_with_index(tmp3, tmp4, 1)
    tmp2 = tmp2_idx[:, None]
    tl.store(out_ptr0 + (x0), tmp2, xmask)
    """,
    params="in_ptr0, out_ptr0, ks0",
    rblock=16,
)

PER_RMS_NORM = _per(
    "add_mean_mul_pow_rsqrt",
    """
    tmp0 = tl.load(in_ptr0 + (r1 + r0_numel * x0), r0_mask & xmask, other=0.0)
    tmp8 = tl.load(in_ptr1 + (r1), r0_mask, eviction_policy="evict_last", other=0.0)
    tmp1 = tmp0 * tmp0
    tmp2 = tl.broadcast_to(tmp1, [XBLOCK, R0_BLOCK])
    tmp4 = tl.where(r0_mask & xmask, tmp2, 0)
    tmp5 = tl.sum(tmp4, 1)[:, None]
    tmp6 = tmp5 / r0_numel.to(tl.float32)
    tmp7 = 1e-06
    tmp9 = tmp6 + tmp7
    tmp10 = libdevice.rsqrt(tmp9)
    tmp11 = tmp0 * tmp10
    tmp12 = tmp11 * tmp8
    tl.store(out_ptr0 + (r1 + r0_numel * x0), tmp12, r0_mask & xmask)
    """,
    params="in_ptr0, in_ptr1, out_ptr0",
)

PER_LAYER_NORM = _per(
    "native_layer_norm",
    """
    tmp0 = tl.load(in_ptr0 + (r1 + r0_numel * x0), r0_mask & xmask, other=0.0)
    tmp21 = tl.load(in_ptr1 + (r1), r0_mask, eviction_policy="evict_last", other=0.0)
    tmp23 = tl.load(in_ptr2 + (r1), r0_mask, eviction_policy="evict_last", other=0.0)
    tmp1 = tl.broadcast_to(tmp0, [XBLOCK, R0_BLOCK])
    tmp3 = tl.where(r0_mask & xmask, tmp1, 0)
    tmp6 = tl.sum(tmp3, 1)[:, None]
    tmp7 = r0_numel.to(tl.float32)
    tmp8 = tmp6 / tmp7
    tmp9 = tmp1 - tmp8
    tmp10 = tmp9 * tmp9
    tmp11 = tl.broadcast_to(tmp10, [XBLOCK, R0_BLOCK])
    tmp13 = tl.where(r0_mask & xmask, tmp11, 0)
    tmp14 = tl.sum(tmp13, 1)[:, None]
    tmp15 = tmp14 / tmp7
    tmp16 = 1e-05
    tmp17 = tmp15 + tmp16
    tmp18 = libdevice.rsqrt(tmp17)
    tmp19 = tmp0 - tmp8
    tmp20 = tmp19 * tmp18
    tmp22 = tmp20 * tmp21
    tmp24 = tmp22 + tmp23
    tl.store(out_ptr0 + (r1 + r0_numel * x0), tmp24, r0_mask & xmask)
    """,
    params="in_ptr0, in_ptr1, in_ptr2, out_ptr0",
)

REDUCTIONS += [
    (
        "sum_dim",
        "triton_red_fused_sum_0",
        _reduction(
            RED_SUM_DIM1,
            """
            (arg0_1,) = args
            args.clear()
            s0, s1, s2 = arg0_1.shape
            buf0 = empty_strided_cpu((s0, s2), (s2, 1), torch.float32)
            xnumel = s0 * s2
            triton_red_fused_sum_0[(triton.cdiv(xnumel, 8),)](
                arg0_1, buf0, s1, s2, xnumel, s1, XBLOCK=8, R0_BLOCK=16, num_warps=2, num_stages=1
            )
            return (buf0,)
            """,
            init="    def __init__(self, dim):\n        super().__init__()",
        ),
    ),
    (
        "var_dim",
        "triton_red_fused_var_0",
        _reduction(
            RED_VAR,
            """
            (arg0_1,) = args
            args.clear()
            xnumel, r0_numel = arg0_1.shape
            buf0 = empty_strided_cpu((xnumel,), (1,), torch.float32)
            triton_red_fused_var_0[(triton.cdiv(xnumel, 4),)](
                arg0_1, buf0, xnumel, r0_numel, XBLOCK=4, R0_BLOCK=32, num_warps=2, num_stages=1
            )
            return (buf0,)
            """,
            init="    def __init__(self, dim):\n        super().__init__()",
        ),
    ),
    (
        "mse_loss",
        "triton_red_fused_mse_loss_0",
        _reduction(
            RED_MSE,
            """
            arg0_1, arg1_1 = args
            args.clear()
            buf0 = empty_strided_cpu((), (), torch.float32)
            buf1 = buf0
            r0_numel = arg0_1.numel()
            triton_red_fused_mse_loss_0[(1,)](
                buf1, arg0_1, arg1_1, 1, r0_numel, XBLOCK=1, R0_BLOCK=512, num_warps=8, num_stages=1
            )
            return (buf1,)
            """,
            forward_args="input_0, input_1",
        ),
    ),
    (
        "cumsum_dim",
        "triton_per_fused_cumsum_0",
        _reduction(
            SCAN,
            """
            (arg0_1,) = args
            args.clear()
            xnumel, r0_numel = arg0_1.shape
            buf0 = empty_strided_cpu((xnumel, r0_numel), (r0_numel, 1), torch.float32)
            triton_per_fused_cumsum_0[(triton.cdiv(xnumel, 4),)](
                arg0_1, buf0, xnumel, r0_numel, XBLOCK=4, num_warps=2, num_stages=1
            )
            return (buf0,)
            """,
            init="    def __init__(self, dim):\n        super().__init__()",
        ),
    ),
    (
        "max_dim",
        "triton_per_fused_max_0",
        _reduction(
            PER_MAX_DIM,
            """
            (arg0_1,) = args
            args.clear()
            r0_numel = arg0_1.shape[-1]
            xnumel = arg0_1.numel() // r0_numel
            buf0 = empty_strided_cpu(tuple(arg0_1.shape[:-1]), (arg0_1.shape[1], 1), torch.float32)
            triton_per_fused_max_0[(triton.cdiv(xnumel, 8),)](
                arg0_1, buf0, xnumel, r0_numel, XBLOCK=8, num_warps=2, num_stages=1
            )
            return (buf0,)
            """,
            init="    def __init__(self, dim):\n        super().__init__()",
        ),
    ),
    (
        "argmax_dim",
        "triton_per_fused_argmax_0",
        _reduction(
            PER_ARGMAX,
            """
            (arg0_1,) = args
            args.clear()
            s0, s1, s2 = arg0_1.shape
            buf0 = empty_strided_cpu((s0, s2), (s2, 1), torch.int64)
            xnumel = s0 * s2
            triton_per_fused_argmax_0[(triton.cdiv(xnumel, 8),)](
                arg0_1, buf0, s2, xnumel, s1, XBLOCK=8, num_warps=2, num_stages=1
            )
            return (buf0,)
            """,
            init="    def __init__(self, dim):\n        super().__init__()",
        ),
    ),
    (
        "rms_norm",
        "triton_per_fused_add_mean_mul_pow_rsqrt_0",
        _reduction(
            PER_RMS_NORM,
            """
            arg0_1, arg1_1 = args
            args.clear()
            xnumel, r0_numel = arg0_1.shape
            buf0 = empty_strided_cpu((xnumel, r0_numel), (r0_numel, 1), torch.float32)
            triton_per_fused_add_mean_mul_pow_rsqrt_0[(triton.cdiv(xnumel, 8),)](
                arg0_1, arg1_1, buf0, xnumel, r0_numel, XBLOCK=8, num_warps=2, num_stages=1
            )
            return (buf0,)
            """,
            forward_args="input_0",
            init="    def __init__(self, dim, eps):\n        super().__init__()\n"
            "        self.weight = nn.Parameter(torch.ones(dim))",
        ).replace("return call([input_0])[0]", "return call([input_0, self.weight])[0]"),
    ),
    (
        "layer_norm",
        "triton_per_fused_native_layer_norm_0",
        _reduction(
            PER_LAYER_NORM,
            """
            arg0_1, arg1_1, arg2_1 = args
            args.clear()
            xnumel, r0_numel = arg0_1.shape
            buf0 = empty_strided_cpu((xnumel, r0_numel), (r0_numel, 1), torch.float32)
            triton_per_fused_native_layer_norm_0[(triton.cdiv(xnumel, 8),)](
                arg0_1, arg1_1, arg2_1, buf0, xnumel, r0_numel, XBLOCK=8, num_warps=2, num_stages=1
            )
            return (buf0,)
            """,
            init="    def __init__(self, normalized_shape):\n        super().__init__()\n"
            "        self.norm = nn.LayerNorm(normalized_shape)",
        ).replace(
            "return call([input_0])[0]",
            "return call([input_0, self.norm.weight, self.norm.bias])[0]",
        ),
    ),
]

RED_L2_NORM_DIM1 = (
    RED_SUM_DIM1.replace("triton_red_fused_sum_0", "triton_red_fused_linalg_vector_norm_0")
    .replace(
        "tmp1 = tl.broadcast_to(tmp0, [XBLOCK, R0_BLOCK])",
        "tmp1 = tl.broadcast_to(tmp0 * tmp0, [XBLOCK, R0_BLOCK])",
    )
    .replace(
        "tl.store(out_ptr0 + (x0 + ks1 * x1), tmp2, xmask)",
        "tmp4 = libdevice.sqrt(tmp2)\n    tl.store(out_ptr0 + (x0 + ks1 * x1), tmp4, xmask)",
    )
)

RED_MIN_DIM0 = """
@triton.jit
def triton_red_fused_min_0(in_ptr0, out_ptr0, xnumel, r0_numel, XBLOCK: tl.constexpr, R0_BLOCK: tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    x0 = xindex
    _tmp2 = tl.full([XBLOCK, R0_BLOCK], float("inf"), tl.float32)
    for r0_offset in range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        r1 = r0_index
        tmp0 = tl.load(in_ptr0 + (x0 + xnumel * r1), r0_mask & xmask, eviction_policy="evict_first", other=0.0)
        tmp1 = tl.broadcast_to(tmp0, [XBLOCK, R0_BLOCK])
        tmp3 = triton_helpers.minimum(_tmp2, tmp1)
        _tmp2 = tl.where(r0_mask & xmask, tmp3, _tmp2)
    tmp2 = triton_helpers.min2(_tmp2, 1)[:, None]
    tl.store(out_ptr0 + (x0), tmp2, xmask)
"""

REDUCTIONS += [
    (
        "l2_norm_dim",
        "triton_red_fused_linalg_vector_norm_0",
        _reduction(
            RED_L2_NORM_DIM1,
            """
            (arg0_1,) = args
            args.clear()
            s0, s1, s2 = arg0_1.shape
            buf0 = empty_strided_cpu((s0, s2), (s2, 1), torch.float32)
            xnumel = s0 * s2
            triton_red_fused_linalg_vector_norm_0[(triton.cdiv(xnumel, 8),)](
                arg0_1, buf0, s1, s2, xnumel, s1, XBLOCK=8, R0_BLOCK=16, num_warps=2, num_stages=1
            )
            return (buf0,)
            """,
            init="    def __init__(self, dim):\n        super().__init__()",
        ),
    ),
    (
        "min_dim",
        "triton_red_fused_min_0",
        _reduction(
            RED_MIN_DIM0,
            """
            (arg0_1,) = args
            args.clear()
            s0, s1, s2 = arg0_1.shape
            buf0 = empty_strided_cpu((s1, s2), (s2, 1), torch.float32)
            xnumel = s1 * s2
            triton_red_fused_min_0[(triton.cdiv(xnumel, 16),)](
                arg0_1, buf0, xnumel, s0, XBLOCK=16, R0_BLOCK=4, num_warps=2, num_stages=1
            )
            return (buf0,)
            """,
            init="    def __init__(self, dim):\n        super().__init__()",
        ),
    ),
]

ENTRIES = [
    Entry(
        name=f"inductor_poi_{problem}",
        origin=ORIGIN + f" (triton_poi_fused_{op}_0)",
        kind="inductor-style",
        problem=problem,
        candidate=_pointwise(op, body, n, init=INITS.get(problem, "")),
    )
    for problem, (op, body, n) in POINTWISE.items()
] + [
    Entry(
        name=f"inductor_{kernel.split('_')[1] if kernel.startswith('triton_') else 'per'}_{problem}",
        origin=ORIGIN
        + f" ({kernel if kernel.startswith('triton_') else f'triton_per_fused_{kernel}_0'})",
        kind="inductor-style",
        problem=problem,
        candidate=source,
    )
    for problem, kernel, source in REDUCTIONS
]
