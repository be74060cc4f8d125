"""Honest Triton in the styles real code is written in earns 1 (issue 41, item 1): what
torch.compile (Inductor) writes, as KernelBook's rows hold it, with its runtime helpers, libdevice
and in-body constexprs; the Triton tutorials (builtin ``min`` of tensors, a parameter named
``num_stages``); Liger-Kernel's docstrings and libdevice imports; autotune pre-hooks and
``reset_to_zero`` before split-K atomics; a custom ``tl.associative_scan`` combine. Every kernel
here is ours, written in the style of the public code each cites; Inductor's helpers are the
installed torch's own, never copied. For each of these relaxations a cheat that leans on it earns
0, with the reason."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stillroom.kernels import evaluate, kernel_source

PROBLEMS = Path(__file__).resolve().parents[2] / "stillroom" / "kernels" / "problems"
IMPORTS = "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n"
# the first lines of every module Inductor writes (torch/_inductor/codegen/triton.py)
INDUCTOR = (
    IMPORTS
    + "from torch._inductor.runtime import triton_helpers\n"
    + "from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math\n"
)


def problem(name: str) -> str:
    return (PROBLEMS / f"{name}.py").read_text()


def module(imports: str, body: str) -> str:
    return imports + "\n\n" + textwrap.dedent(body).strip() + "\n"


# In the style of Inductor's persistent reductions (torch/_inductor/codegen/triton.py, as
# KernelBook's rows and TritonTrace hold them): triton_helpers.max2, tl_math.exp, an in-body
# constexpr R0_BLOCK, numels passed in (dynamic shapes).
INDUCTOR_SOFTMAX = module(
    INDUCTOR,
    """
    @triton.jit
    def triton_per_fused__softmax_0(in_ptr0, out_ptr2, xnumel, r0_numel, XBLOCK: tl.constexpr):
        R0_BLOCK: tl.constexpr = 128
        rnumel = r0_numel
        RBLOCK: tl.constexpr = R0_BLOCK
        xoffset = tl.program_id(0) * XBLOCK
        xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
        xmask = xindex < xnumel
        r0_index = tl.arange(0, RBLOCK)[None, :]
        r0_offset = 0
        r0_mask = r0_index < rnumel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        x0 = xindex
        tmp0 = tl.load(in_ptr0 + (r0_1 + r0_numel * x0), r0_mask & xmask, other=0.0)
        tmp1 = tl.broadcast_to(tmp0, [XBLOCK, R0_BLOCK])
        tmp3 = tl.where(r0_mask & xmask, tmp1, float("-inf"))
        tmp4 = triton_helpers.max2(tmp3, 1)[:, None]
        tmp5 = tmp0 - tmp4
        tmp6 = tl_math.exp(tmp5)
        tmp7 = tl.broadcast_to(tmp6, [XBLOCK, R0_BLOCK])
        tmp9 = tl.where(r0_mask & xmask, tmp7, 0)
        tmp10 = tl.sum(tmp9, 1)[:, None]
        tmp11 = tmp6 / tmp10
        tl.store(out_ptr2 + (r0_1 + r0_numel * x0), tmp11, r0_mask & xmask)


    class ModelNew(nn.Module):
        def forward(self, arg0_1):
            arg0_1 = arg0_1.contiguous()
            buf2 = torch.empty_like(arg0_1)
            xnumel, r0_numel = arg0_1.shape
            triton_per_fused__softmax_0[(triton.cdiv(xnumel, 8),)](
                arg0_1, buf2, xnumel, r0_numel, XBLOCK=8
            )
            return buf2
    """,
)


def inductor_pointwise(name: str, body: str) -> str:
    """An Inductor pointwise kernel (triton_poi_fused_*) over every element, ``body`` computing
    tmp_out from tmp0."""
    kernel = textwrap.indent(textwrap.dedent(body).strip(), " " * 4)
    return module(
        INDUCTOR,
        f"""
@triton.jit
def {name}(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (x0), xmask)
{kernel}
    tl.store(out_ptr0 + (x0), tmp_out, xmask)


class ModelNew(nn.Module):
    def forward(self, arg0_1):
        arg0_1 = arg0_1.contiguous()
        buf0 = torch.empty_like(arg0_1)
        xnumel = arg0_1.numel()
        {name}[(triton.cdiv(xnumel, 512),)](arg0_1, buf0, xnumel, XBLOCK=512)
        return buf0
""",
    )


# Inductor's relu: triton_helpers.maximum of an int32 zero and the input
INDUCTOR_RELU = inductor_pointwise(
    "triton_poi_fused_relu_0",
    """
    tmp1 = tl.full([1], 0, tl.int32)
    tmp_out = triton_helpers.maximum(tmp1, tmp0)
    """,
)
# Inductor's gelu(approximate="tanh"): libdevice.tanh
INDUCTOR_GELU_TANH = inductor_pointwise(
    "triton_poi_fused_add_gelu_mul_pow_tanh_0",
    """
    tmp1 = 0.5
    tmp2 = tmp0 * tmp1
    tmp3 = tmp0 * tmp0
    tmp4 = tmp3 * tmp0
    tmp5 = 0.044715
    tmp6 = tmp4 * tmp5
    tmp7 = tmp0 + tmp6
    tmp8 = 0.7978845608028654
    tmp9 = tmp7 * tmp8
    tmp10 = libdevice.tanh(tmp9)
    tmp11 = 1.0
    tmp12 = tmp10 + tmp11
    tmp_out = tmp2 * tmp12
    """,
)
# Inductor's mish: softplus with its threshold (libdevice.log1p), then libdevice.tanh
INDUCTOR_MISH = inductor_pointwise(
    "triton_poi_fused_mish_0",
    """
    tmp1 = 20.0
    tmp2 = tmp0 > tmp1
    tmp3 = tl_math.exp(tmp0)
    tmp4 = libdevice.log1p(tmp3)
    tmp5 = tl.where(tmp2, tmp0, tmp4)
    tmp6 = libdevice.tanh(tmp5)
    tmp_out = tmp0 * tmp6
    """,
)

# In the style of the Triton tutorial 03-matrix-multiplication.py (github.com/triton-lang/triton,
# python/tutorials): grouped ordering with builtin min() of run-time values.
MATMUL_TUTORIAL = module(
    IMPORTS,
    """
    @triton.jit
    def matmul_kernel(
        a_ptr, b_ptr, c_ptr, M, N, K,
        stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
        GROUP_SIZE_M: tl.constexpr,
    ):
        pid = tl.program_id(axis=0)
        num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
        num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
        num_pid_in_group = GROUP_SIZE_M * num_pid_n
        group_id = pid // num_pid_in_group
        first_pid_m = group_id * GROUP_SIZE_M
        group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
        pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
        pid_n = (pid % num_pid_in_group) // group_size_m
        offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
        offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
        offs_k = tl.arange(0, BLOCK_SIZE_K)
        a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
        b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
        accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
            a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_SIZE_K, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_SIZE_K, other=0.0)
            accumulator = tl.dot(a, b, accumulator, input_precision="ieee")
            a_ptrs += BLOCK_SIZE_K * stride_ak
            b_ptrs += BLOCK_SIZE_K * stride_bk
        offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
        offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
        c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
        tl.store(c_ptrs, accumulator, mask=c_mask)


    class ModelNew(nn.Module):
        def forward(self, a, b):
            M, K = a.shape
            K, N = b.shape
            c = torch.empty((M, N), device=a.device, dtype=torch.float32)
            grid = lambda META: (
                triton.cdiv(M, META["BLOCK_SIZE_M"]) * triton.cdiv(N, META["BLOCK_SIZE_N"]),
            )
            matmul_kernel[grid](
                a, b, c, M, N, K,
                a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16, GROUP_SIZE_M=2,
            )
            return c
    """,
)

# In the style of the Triton tutorial 02-fused-softmax.py: a persistent row loop whose
# tl.range takes num_stages, a kernel parameter named like the launch option.
SOFTMAX_TUTORIAL = module(
    IMPORTS,
    """
    @triton.jit
    def softmax_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_rows, n_cols,
                       BLOCK_SIZE: tl.constexpr, num_stages: tl.constexpr):
        row_start = tl.program_id(0)
        row_step = tl.num_programs(0)
        for row_idx in tl.range(row_start, n_rows, row_step, num_stages=num_stages):
            row_start_ptr = input_ptr + row_idx * input_row_stride
            col_offsets = tl.arange(0, BLOCK_SIZE)
            input_ptrs = row_start_ptr + col_offsets
            mask = col_offsets < n_cols
            row = tl.load(input_ptrs, mask=mask, other=-float("inf"))
            row_minus_max = row - tl.max(row, axis=0)
            numerator = tl.exp(row_minus_max)
            denominator = tl.sum(numerator, axis=0)
            softmax_output = numerator / denominator
            output_row_start_ptr = output_ptr + row_idx * output_row_stride
            output_ptrs = output_row_start_ptr + col_offsets
            tl.store(output_ptrs, softmax_output, mask=mask)


    class ModelNew(nn.Module):
        def forward(self, x):
            n_rows, n_cols = x.shape
            y = torch.empty_like(x)
            BLOCK_SIZE = triton.next_power_of_2(n_cols)
            num_programs = min(4, n_rows)
            softmax_kernel[(num_programs, 1, 1)](
                y, x, x.stride(0), y.stride(0), n_rows, n_cols,
                BLOCK_SIZE=BLOCK_SIZE, num_stages=2,
            )
            return y
    """,
)

# In the style of Liger-Kernel's RMSNorm (liger_kernel/ops/rms_norm.py): a docstring longer than
# any string constant a kernel may hold, rsqrt imported from libdevice, module-level constexpr
# casting modes, the row pointers advanced in place, rstd kept in a buffer of its own.
LIGER_RMS_NORM = module(
    IMPORTS + "from triton.language.extra.libdevice import rsqrt\n",
    '''
    _CASTING_MODE_NONE = tl.constexpr(-1)
    _CASTING_MODE_LLAMA = tl.constexpr(0)


    @triton.jit
    def _rms_norm_forward_kernel(
        Y_ptr, Y_row_stride, X_ptr, X_row_stride, W_ptr, RSTD_ptr, RSTD_row_stride, n_cols, eps,
        casting_mode: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    ):
        """
        y_i = (x_i / RMS) * w_i with RMS = sqrt(sum(x_i ** 2) / N + eps), one row per program.

        The reciprocal of the RMS is kept per row for a backward pass; in the LLaMA casting mode
        only it is computed in fp32 and the normalised row is cast back before the weight
        multiplies it, as the reference implementation does.
        """
        row_idx = tl.program_id(0).to(tl.int64)
        col_offsets = tl.arange(0, BLOCK_SIZE)
        mask = col_offsets < n_cols
        Y_ptr += row_idx * Y_row_stride
        X_ptr += row_idx * X_row_stride
        RSTD_ptr += row_idx * RSTD_row_stride
        X_row = tl.load(X_ptr + col_offsets, mask=mask, other=0)
        X_row_dtype = X_row.dtype
        W_row = tl.load(W_ptr + col_offsets, mask=mask, other=0)
        if casting_mode == _CASTING_MODE_LLAMA:
            X_row = X_row.to(tl.float32)
        mean_square = tl.sum(X_row * X_row, axis=0) / n_cols
        rstd = rsqrt(mean_square + eps)
        tl.store(RSTD_ptr, rstd)
        X_row = X_row * rstd
        if casting_mode == _CASTING_MODE_LLAMA:
            X_row = X_row.to(X_row_dtype)
        Y_row = X_row * W_row
        tl.store(Y_ptr + col_offsets, Y_row, mask=mask)


    class ModelNew(nn.Module):
        def __init__(self, dim, eps):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            shape = x.shape
            X = x.reshape(-1, shape[-1])
            n_rows, n_cols = X.shape
            Y = torch.empty_like(X)
            RSTD = torch.empty(n_rows, dtype=torch.float32, device=X.device)
            _rms_norm_forward_kernel[(n_rows,)](
                Y, Y.stride(0), X, X.stride(0), self.weight, RSTD, RSTD.stride(0), n_cols,
                self.eps, casting_mode=_CASTING_MODE_LLAMA,
                BLOCK_SIZE=triton.next_power_of_2(n_cols),
            )
            return Y.view(*shape)
    ''',
)


def split_k(autotune: str) -> str:
    """A split-K matmul whose programs add their partial products into C with atomics, C made
    with torch.empty: only the autotuner's hook (``autotune``) zeroes it first."""
    return module(
        IMPORTS,
        f"""
    def init_to_zero(name):
        return lambda nargs: nargs[name].zero_()


    {autotune}
    @triton.jit
    def _splitk_kernel(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                       stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        pid_k = tl.program_id(2)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K * SPLIT_K)):
            kk = k * BLOCK_K * SPLIT_K + rk
            a = tl.load(A + rm[:, None] * stride_am + kk[None, :] * stride_ak,
                        mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
            b = tl.load(B + kk[:, None] * stride_bk + rn[None, :] * stride_bn,
                        mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc += tl.dot(a, b, input_precision="ieee")
        c = C + rm[:, None] * stride_cm + rn[None, :] * stride_cn
        tl.atomic_add(c, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


    class ModelNew(nn.Module):
        def forward(self, a, b):
            M, K = a.shape
            K, N = b.shape
            c = torch.empty((M, N), device=a.device, dtype=torch.float32)
            grid = lambda META: (
                triton.cdiv(M, META["BLOCK_M"]), triton.cdiv(N, META["BLOCK_N"]), META["SPLIT_K"]
            )
            _splitk_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0),
                                 b.stride(1), c.stride(0), c.stride(1))
            return c
    """,
    )


# In the style of Triton 2.x's triton/ops/matmul.py (github.com/triton-lang/triton, release/2.1.x):
# split-K configs carry pre_hook=init_to_zero("C").
SPLIT_K_PRE_HOOK = split_k(
    "@triton.autotune(configs=[triton.Config("
    '{"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "SPLIT_K": 2}, pre_hook=init_to_zero("C"))], '
    'key=["M", "N", "K"])'
)
# The same with reset_to_zero=["C"] and two configs: Triton benchmarks them, then zeroes C.
SPLIT_K_RESET = split_k(
    "@triton.autotune(configs=["
    'triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "SPLIT_K": 2}), '
    'triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "SPLIT_K": 3})], '
    'key=["M", "N", "K"], reset_to_zero=["C"])'
)

# In the style of the scan tests of Triton (python/test/unit/language/test_core.py, test_scan2d:
# a 2-D tile scanned along an axis with a combine_fn of its own) and FlagGems' cumsum:
# tl.associative_scan with a custom combine over 16 rows at a time.
SCAN = module(
    IMPORTS,
    """
    @triton.jit
    def _add_combine(a, b):
        return a + b


    @triton.jit
    def cumsum_rows(x_ptr, out_ptr, n_rows, n_cols, BLOCK_R: tl.constexpr, BLOCK: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
        cols = tl.arange(0, BLOCK)[None, :]
        mask = (rows < n_rows) & (cols < n_cols)
        x = tl.load(x_ptr + rows * n_cols + cols, mask=mask, other=0.0)
        y = tl.associative_scan(x, 1, _add_combine)
        tl.store(out_ptr + rows * n_cols + cols, y, mask=mask)


    class ModelNew(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.dim = dim

        def forward(self, x):
            x = x.contiguous()
            out = torch.empty_like(x)
            rows, cols = x.shape
            cumsum_rows[(triton.cdiv(rows, 16),)](
                x, out, rows, cols, BLOCK_R=16, BLOCK=triton.next_power_of_2(cols)
            )
            return out
    """,
)

# name -> (problem, candidate)
HONEST = {
    "inductor softmax: triton_helpers.max2, tl_math, in-body constexpr": (
        "softmax_rows",
        INDUCTOR_SOFTMAX,
    ),
    "inductor relu: triton_helpers.maximum": ("relu", INDUCTOR_RELU),
    "inductor gelu: libdevice.tanh": ("gelu_tanh", INDUCTOR_GELU_TANH),
    "inductor mish: libdevice.log1p and tanh": ("mish", INDUCTOR_MISH),
    "matmul tutorial: builtin min of tensors": ("matmul", MATMUL_TUTORIAL),
    "fused softmax tutorial: a parameter named num_stages": ("softmax_rows", SOFTMAX_TUTORIAL),
    "liger rms norm: a docstring, libdevice rsqrt": ("rms_norm", LIGER_RMS_NORM),
    "split-K: Config(pre_hook=init_to_zero)": ("matmul", SPLIT_K_PRE_HOOK),
    "split-K: reset_to_zero": ("matmul", SPLIT_K_RESET),
    "custom associative_scan combine": ("cumsum_dim", SCAN),
}
# make test-fast's slice: Inductor's helpers, an in-body constexpr, a combine of the program's
FAST = {
    "inductor softmax: triton_helpers.max2, tl_math, in-body constexpr",
    "custom associative_scan combine",
}


@pytest.mark.parametrize(
    "name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in HONEST]
)
def test_an_honest_kernel_in_this_style_earns_1(name):
    name_of_problem, source = HONEST[name]
    r = evaluate(problem(name_of_problem), source, trials=1)
    assert r.reward == 1, (name, r.reasons)


RELU_LAUNCH = """

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        {launch}
        return out
"""


def relu(kernel: str, launch: str, prelude: str = "") -> str:
    return module(IMPORTS + prelude, kernel) + RELU_LAUNCH.format(launch=launch)


RELU_BODY = """
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)
"""
RELU_GRID = "relu_kernel[(triton.cdiv(x.numel(), 1024),)]"

# name -> (problem, candidate, a phrase of the reasons)
CHEATS = {
    # the record names the trusted module; its installed max2 runs, not the candidate's sum
    "a module of its own under triton_helpers' name": (
        "sum_dim",
        module(
            IMPORTS + "import types\n",
            """
            triton_helpers = types.ModuleType("torch._inductor.runtime.triton_helpers")


            @triton.jit
            def _sum2(a, dim):
                return tl.sum(a, dim)


            triton_helpers.max2 = _sum2


            @triton.jit
            def triton_per_fused_sum_0(in_ptr0, out_ptr0, R, C, RBLOCK: tl.constexpr,
                                       CBLOCK: tl.constexpr):
                b = tl.program_id(0)
                r = tl.arange(0, RBLOCK)[:, None]
                c = tl.arange(0, CBLOCK)[None, :]
                tmp0 = tl.load(in_ptr0 + b * R * C + r * C + c, (r < R) & (c < C), other=0.0)
                tmp1 = triton_helpers.max2(tmp0, 0)
                cols = tl.arange(0, CBLOCK)
                tl.store(out_ptr0 + b * C + cols, tmp1, cols < C)


            class ModelNew(nn.Module):
                def __init__(self, dim):
                    super().__init__()

                def forward(self, x):
                    x = x.contiguous()
                    B, R, C = x.shape
                    out = torch.empty((B, C), dtype=x.dtype, device=x.device)
                    triton_per_fused_sum_0[(B,)](
                        x, out, R, C, RBLOCK=triton.next_power_of_2(R),
                        CBLOCK=triton.next_power_of_2(C),
                    )
                    return out
            """,
        ),
        "elements off",
    ),
    "libdevice without an equivalent the interpreter runs": (
        "relu",
        inductor_pointwise("triton_poi_fused_atan_0", "tmp_out = libdevice.atan(tmp0)"),
        "libdevice.atan, which Triton's CPU interpreter cannot run",
    ),
    "an in-body constexpr block beyond the limit": (
        "softmax_rows",
        INDUCTOR_SOFTMAX.replace("R0_BLOCK: tl.constexpr = 128", "R0_BLOCK: tl.constexpr = 4096"),
        "a block of 4096 elements (tl.arange or a block shape) exceeds 2048",
    ),
    "builtin max of one tensor (Python would iterate it)": (
        "relu",
        relu(
            "@triton.jit\ndef relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):"
            + RELU_BODY.replace(
                "tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0)",
                "max(tl.load(x_ptr + offs, mask=mask))",
            ),
            RELU_GRID + "(x, out, x.numel(), BLOCK=1024)",
        ),
        "max() of Triton tensors takes two or more of them",
    ),
    "a parameter named num_warps does not hide the launch's warps": (
        "relu",
        relu(
            "@triton.jit\ndef relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, "
            "num_warps: tl.constexpr):" + RELU_BODY,
            RELU_GRID + "(x, out, x.numel(), BLOCK=1024, num_warps=64)",
        ),
        "num_warps=64 is 2048 threads per block, more than 1024",
    ),
    "a long string that is not the docstring": (
        "relu",
        relu(
            '@triton.jit\ndef relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n    """relu"""'
            + RELU_BODY
            + f'    "{"0123456789" * 30}"\n',
            RELU_GRID + "(x, out, x.numel(), BLOCK=1024)",
        ),
        "a string constant of 300 characters",
    ),
    # what a hook computes with torch is no step of the program: the replay's output stays unwritten
    "a pre_hook that computes the output on the host": (
        "relu",
        relu(
            """
            @triton.autotune(
                configs=[triton.Config(
                    {"BLOCK": 1024},
                    pre_hook=lambda nargs: nargs["out_ptr"].copy_(torch.relu(nargs["x_ptr"])),
                )],
                key=["n"],
            )
            @triton.jit
            def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
                offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
                mask = offs < n
                tl.store(out_ptr + offs, tl.load(out_ptr + offs, mask=mask), mask=mask)
            """,
            RELU_GRID + "(x, out, x.numel())",
        ),
        "elements off",
    ),
    # a combine is counted once per scan, its own unrolled loop every iteration
    "a scan whose combine unrolls a long loop": (
        "cumsum_dim",
        SCAN.replace(
            "    return a + b",
            "    s = a + b\n    for _ in tl.static_range(1100):\n        s = s * 1.0 + 0.0\n"
            "    return s",
        ),
        "instructions per program",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CHEATS))
def test_a_cheat_through_a_relaxation_earns_0(name):
    name_of_problem, source, phrase = CHEATS[name]
    r = evaluate(problem(name_of_problem), source, trials=1, cases=[])
    assert r.status == "scored" and r.reward == 0, (name, r)
    assert any(phrase in why for why in r.reasons), (name, r.reasons)


LANG = {"module": "triton.language"}
HELPERS = "torch._inductor.runtime.triton_helpers"


def test_inductors_helpers_are_read_from_the_installed_torch_never_from_the_record():
    """triton_helpers.max2 brings the installed max2 and what it calls (maximum, is_floating,
    promote_to_tensor); a record that offers a body under a trusted function's id is refused."""
    from torch._inductor.runtime import triton_helpers

    kernel = {
        "name": "k",
        "source": "def k(p):\n    tl.store(p, triton_helpers.max2(tl.load(p), 0))\n",
        "globals": {"tl": LANG, "triton_helpers": {"module": HELPERS}},
    }
    out = kernel_source.check({"0:k": kernel})
    names = {k.name for k in out.values()}
    assert names == {"k", "max2", "maximum", "is_floating", "promote_to_tensor"}, names
    assert all(not k.reasons for k in out.values()), [k.reasons for k in out.values()]
    assert "tl.store(p, kt_triton_helpers_max2(tl.load(p), 0))" in out["0:k"].text
    installed = textwrap.dedent(inspect.getsource(triton_helpers.maximum.fn))
    canonical = out[kernel_source.trusted_kid(HELPERS, "maximum")].text
    assert ast_body(canonical.replace("kt_triton_helpers_", "")) == ast_body(installed)
    forged = {
        "name": "max2",
        "source": "def max2(a, dim):\n    return tl.sum(a, dim)\n",
        "globals": {"tl": LANG},
    }
    kid = kernel_source.trusted_kid(HELPERS, "max2")
    out = kernel_source.check({"0:k": kernel, kid: forged})
    assert out[kid].reasons == [f"kernel max2: its id {kid!r} is reserved"]
    missing = {**kernel, "source": kernel["source"].replace("max2", "no_such_helper")}
    assert (
        "kernel k, line 2: uses triton_helpers.no_such_helper: no @triton.jit function of "
        + HELPERS
    ) in kernel_source.check({"0:k": missing})["0:k"].reasons


def ast_body(source: str) -> str:
    """A function's statements as the canonical source writes them."""
    import ast

    return "\n".join(ast.unparse(s) for s in ast.parse(source).body[0].body)


def test_a_docstring_is_dropped_and_an_in_body_constexpr_stays_one():
    out = kernel_source.check(
        {
            "0:k": {
                "name": "k",
                "source": 'def k(p, N):\n    """' + "why " * 100 + '"""\n'
                "    RBLOCK: L.constexpr = 256\n    x: L.float32 = tl.load(p)\n"
                "    tl.store(p + tl.arange(0, RBLOCK), x, mask=tl.arange(0, RBLOCK) < N)\n",
                "globals": {"tl": LANG, "L": LANG},
            }
        }
    )["0:k"]
    assert out.reasons == []
    assert out.text == (
        "def k0_k(p, N):\n    RBLOCK: tl.constexpr = 256\n    x = tl.load(p)\n"
        "    tl.store(p + tl.arange(0, RBLOCK), x, mask=tl.arange(0, RBLOCK) < N)"
    )


# libdevice functions (stillroom.kernels.libdevice) against torch in float64, run by Triton's
# interpreter in a process of its own (TRITON_INTERPRET is read when triton is imported)
LIBDEVICE_CHECK = """
import json, sys
import torch, triton, triton.language as tl
from stillroom.kernels import libdevice as ld

@triton.jit
def unary(x_ptr, out_ptr, n, FN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, FN(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)

@triton.jit
def binary(x_ptr, y_ptr, out_ptr, n, FN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x, y = tl.load(x_ptr + offs, mask=offs < n), tl.load(y_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, FN(x, y), mask=offs < n)

special = [0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1e-6, -1e-6, 1e-3, 30.0, -30.0, 80.0, -80.0]
special += [float("inf"), float("-inf"), float("nan")]
x = torch.cat([torch.linspace(-10, 10, 201), torch.tensor(special)]).float()
y = torch.tensor([-3.0, -2.5, -1.0, 0.0, 0.5, 1.0, 2.0, 3.0]).repeat(28)[: x.numel()]
d = x.double()
round_away = torch.trunc(d + torch.copysign(torch.full_like(d, 0.5), d))
unary_refs = {
    "tanh": torch.tanh(d), "sinh": torch.sinh(d), "cosh": torch.cosh(d), "tan": torch.tan(d),
    "log1p": torch.log1p(d), "expm1": torch.expm1(d), "log10": torch.log10(d),
    "exp10": torch.pow(10.0, d), "isnan": torch.isnan(d), "isinf": torch.isinf(d),
    "isfinite": torch.isfinite(d), "signbit": torch.signbit(d).int(), "trunc": torch.trunc(d),
    "rint": torch.round(d), "round": round_away, "cbrt": torch.sign(d) * d.abs() ** (1 / 3),
    "erfc": torch.special.erfc(d), "asinh": torch.asinh(d), "acosh": torch.acosh(d),
    "atanh": torch.atanh(d),
}
binary_refs = {
    "pow": torch.pow(d, y.double()), "copysign": torch.copysign(d, y.double()),
    "fmod": torch.fmod(d, y.double()), "hypot": torch.hypot(d, y.double()),
}
bad = {}
for name, ref in [*unary_refs.items(), *binary_refs.items()]:
    exact = ref.dtype in (torch.bool, torch.int32)
    out = torch.empty(x.numel(), dtype=ref.dtype if exact else torch.float32)
    args = (x, out) if name in unary_refs else (x, y, out)
    kernel = unary if name in unary_refs else binary
    kernel[(1,)](*args, x.numel(), FN=getattr(ld, name), BLOCK=256)
    if out.dtype.is_floating_point:
        # against torch's value rounded to fp32 (what an fp32 libdevice returns)
        ok = torch.isclose(out, ref.float(), rtol=1e-5, atol=1e-5, equal_nan=True)
    else:
        ok = out == ref.to(out.dtype)
    if not bool(ok.all()):
        bad[name] = [[float(v[~ok][0]) for v in (x, y, out, ref)], int((~ok).sum())]
print(json.dumps(bad))
"""


def test_libdevices_stand_ins_compute_what_torch_computes():
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    run = subprocess.run(
        [sys.executable, "-c", LIBDEVICE_CHECK], env=env, capture_output=True, text=True,
        timeout=300, cwd=root,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {}


def test_an_autotuners_hook_steps_are_fills_and_copies_of_the_programs_tensors():
    """What a hook did reaches the replay as the config's ``before`` steps; a launch a hook makes
    (or anything but a fill or a copy) refuses the record."""
    from stillroom.kernels import program

    from .test_program import INPUT, VIEW, launch, record

    zero = {"op": "fill", "tensor": VIEW, "value": 0}
    parsed = program.parse(record(steps=[launch(before=[zero])]), [INPUT], {})
    (p,) = parsed.programs
    assert p.steps[0]["alternatives"][0].before == [{"op": "fill", "tensor": 0, "value": 0}]
    assert p.to_json()["steps"][0]["alternatives"][0]["before"] == [
        {"op": "fill", "tensor": 0, "value": 0}
    ]
    parsed = program.parse(record(steps=[launch(before=[launch()])]), [INPUT], {})
    assert parsed.programs == [None]
    assert "a step of an autotuner's hook: op 'launch'" in parsed.errors[0], parsed.errors
